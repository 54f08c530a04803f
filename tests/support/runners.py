"""Run an image with each runtime the tests cover: docker, podman, and runc after umoci unpack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.containers import docker, wait_healthy
from tests.support.net import free_port, wait_for_status


def _storage() -> list[str]:
    driver = os.environ.get("MBUILD_CONTAINERS_STORAGE_DRIVER")
    return ["--storage-driver", driver] if driver else []


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *_storage(), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


@contextmanager
def docker_run(image: str, *extra: str) -> Iterator[str]:
    port = free_port()
    result = docker("run", "-d", "--network", "host", "-e", f"MBUILD_PORT={port}", *extra, image)
    assert result.returncode == 0, result.stderr
    container = result.stdout.strip()
    try:
        wait_healthy(container)
        yield f"http://127.0.0.1:{port}"
    finally:
        docker("rm", "-f", container)


@contextmanager
def podman_run(image: str) -> Iterator[str]:
    """podman's health timers need systemd, so the test runs its HEALTHCHECK by hand, as documented."""
    port = free_port()
    result = podman("run", "-d", "--runtime", "runc", "--network", "host", "--ulimit", "nofile=1024:1024",
                    "--ulimit", "nproc=4096:4096", "-e", f"MBUILD_PORT={port}", image)
    assert result.returncode == 0, result.stderr
    container = result.stdout.strip()
    try:
        deadline = time.monotonic() + 180
        while podman("healthcheck", "run", container).returncode != 0:
            assert time.monotonic() < deadline, podman("logs", container).stdout[-3000:]
            time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        podman("rm", "-f", container)


@contextmanager
def runc_run(layout: Path, tag: str, work: Path) -> Iterator[str]:
    """umoci unpacks the OCI layout into a bundle; runc runs it on the host network."""
    bundle = work / "bundle"
    unpacked = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], capture_output=True,
                              text=True, check=False)
    assert unpacked.returncode == 0, unpacked.stderr
    port = free_port()
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "network"]
    config["process"]["terminal"] = False
    config["process"]["env"].append(f"MBUILD_PORT={port}")
    # docker and Kubernetes inject /etc/hosts; a bare runc bundle has none, and localhost must resolve.
    config["mounts"].append({"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts",
                             "options": ["rbind", "ro"]})
    (bundle / "config.json").write_text(json.dumps(config))
    name = f"mbuild-test-{port}"
    with (work / "runc.log").open("w") as log:
        started = subprocess.run(["runc", "run", "-d", name], cwd=bundle, stdout=log, stderr=subprocess.STDOUT,
                                 check=False)
    assert started.returncode == 0, (work / "runc.log").read_text()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_status(f"{url}/v1/health/ready", 200, timeout=120)
        health = subprocess.run(["runc", "exec", name, "python3", "-m", "runtimes.healthcheck"], check=False)
        assert health.returncode == 0  # the image's own HEALTHCHECK command agrees
        yield url
    finally:
        subprocess.run(["runc", "delete", "--force", name], capture_output=True, check=False)
        shutil.rmtree(bundle, ignore_errors=True)
