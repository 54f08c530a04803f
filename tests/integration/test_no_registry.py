"""A host with no container registry, as a new user meets it: a base from `mbuild base` (the one .ci made from the
Debian mirror), an offline build with the daemonless writer, the image loaded into docker and podman with
`mbuild load`, and the running container answering. Plus the quickstart's refusal of a busy port."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import require
from tests.support.procs import mbuild
from tests.support.runners import docker_run, podman_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RUNNERS: dict[str, Callable[[str], AbstractContextManager[str]]] = {"docker": docker_run, "podman": podman_run}


@pytest.fixture(scope="module")
def base() -> str:
    reference = os.environ.get("MBUILD_TEST_BASE_MBUILD", "")
    if not reference:
        require("no base from `mbuild base` (MBUILD_TEST_BASE_MBUILD; tests/run.sh makes it)")
    return reference


@pytest.fixture(scope="module")
def built(base: str, tiny_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    out = tmp_path_factory.mktemp("no-registry") / "build"
    result = mbuild("package", str(tiny_encoder), "--offline", "--backend", "oci", "--base-image", base,
                    "--name", "mbuild-test/no-registry", "--version", "it", "--output", str(out))
    assert result.returncode == 0, result.stderr
    digest = re.search(r"sha256:[0-9a-f]{64}", result.stdout + result.stderr)
    assert digest, result.stdout + result.stderr  # the summary prints the image's digest
    yield out, digest.group(0)


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_the_image_from_an_mbuild_base_runs_in_each_engine(built: tuple[Path, str], engine: str) -> None:
    build_dir, _ = built
    name = f"mbuild-test/no-registry:{engine}"
    result = mbuild("load", str(build_dir), "--into", engine, "--tag", name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name
    with RUNNERS[engine](name) as url:
        reply = httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 32


def test_the_quickstart_refuses_a_busy_port_at_once() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(["bash", "examples/quickstart.sh"], cwd=REPO, capture_output=True, text=True,
                                timeout=600, env={**os.environ, "PORT": str(port)}, check=False)
    assert result.returncode == 1
    assert f"port {port} is busy" in result.stderr and "Traceback" not in result.stderr
