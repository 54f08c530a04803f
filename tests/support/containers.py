"""Running and inspecting containers with the real docker CLI."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.net import free_port


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def inspect(ref: str, kind: str = "image") -> dict[str, Any]:
    result = docker(kind, "inspect", ref)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)[0]
    return data


def wait_healthy(container: str, timeout: float = 180) -> float:
    start = time.monotonic()
    status = "?"
    while time.monotonic() - start < timeout:
        state = inspect(container, "container")["State"]
        status = state.get("Health", {}).get("Status", "none")
        if status == "healthy":
            return time.monotonic() - start
        if not state["Running"]:
            break
        time.sleep(1)
    logs = docker("logs", container).stdout + docker("logs", container).stderr
    raise AssertionError(f"container {container} not healthy (last: {status})\n{logs[-3000:]}")


@contextmanager
def running(image: str, *extra: str) -> Iterator[tuple[str, str]]:
    """Run image on the host network at a free port; yields (container id, base URL)."""
    port = free_port()
    result = docker("run", "-d", "--network", "host", "-e", f"MBUILD_PORT={port}", *extra, image)
    assert result.returncode == 0, result.stderr
    container = result.stdout.strip()
    try:
        yield container, f"http://127.0.0.1:{port}"
    finally:
        docker("rm", "-f", container)
