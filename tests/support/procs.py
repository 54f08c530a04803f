"""Processes started by tests: the mbuild CLI, a served build, and stopping them by pid."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.net import free_port, wait_for_status

MBUILD = [sys.executable, "-m", "builder.cli"]


def mbuild(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MBUILD, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


@contextmanager
def served(build_dir: Path, env: dict[str, str] | None = None, ca: Path | None = None, args: tuple[str, ...] = (),
           ready: str = "/v1/health/ready") -> Iterator[str]:
    """`mbuild serve BUILD_DIR [args]` on a free loopback port; yields the base URL once `ready` answers 200
    (https, trusting ca)."""
    port = free_port()
    log = build_dir / f"serve-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*MBUILD, "serve", str(build_dir), "--port", str(port), *args], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True)
    url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=str(ca)) if ca else True
    try:
        wait_for_status(f"{url}{ready}", 200, timeout=120, verify=verify)
        yield url
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- server log ---\n{log.read_text()[-3000:]}") from exc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
