"""Fixtures for tests that package the real MiniLM and run real servers, engines and registries."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from tests.conftest import MINILM_REPO
from tests.support.containers import docker
from tests.support.procs import mbuild

BASE_IMAGE = os.environ.get("MBUILD_TEST_BASE_IMAGE", "mbuild-local/python:3.11-bookworm")
TEXTS = ["hello world", "Containers package software with everything it needs to run.",
         "Prix: 12,50 € — déjà vu", "A longer passage about inference servers, health checks and batching. " * 5]


@dataclass(frozen=True)
class Bases:
    """The same local Python base, as each backend takes it."""

    docker: str  # a name the Docker engine holds
    oci: str  # oci:DIR:TAG for the daemonless writer
    registry: str  # host:port of the local registry
    in_registry: str  # the base pushed there, for podman and buildah


@pytest.fixture(scope="session")
def minilm_hf_home(tmp_path_factory: pytest.TempPathFactory, minilm_source: Path) -> Path:
    """A Hugging Face cache holding MiniLM, written by `mbuild cache import` (the air-gapped workflow)."""
    home = tmp_path_factory.mktemp("minilm-hf-home")
    result = mbuild("cache", "import", str(minilm_source), "--repo", MINILM_REPO, env={"HF_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    return home


@pytest.fixture(scope="session")
def reference_embeddings(minilm_source: Path) -> np.ndarray:
    model = SentenceTransformer(str(minilm_source), device="cpu")
    return np.asarray(model.encode(TEXTS, convert_to_numpy=True), dtype=np.float64)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got = np.asarray(got, dtype=np.float64)
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def _ok(*command: str) -> bool:
    return shutil.which(command[0]) is not None and subprocess.run(
        list(command), capture_output=True, check=False, timeout=60).returncode == 0


def require(reason: str) -> None:
    """Skip with the reason, unless the test runner promised the tools (then it is a failure)."""
    if os.environ.get("MBUILD_REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"container tools are required here (MBUILD_REQUIRE_CONTAINERS=1) but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_available() -> None:
    if not _ok("docker", "info"):
        require("no Docker engine answers (start one: .ci/start-dockerd.sh)")
    if not _ok("docker", "image", "inspect", BASE_IMAGE):
        require(f"base image {BASE_IMAGE} missing (make it: .ci/local-base-image.sh)")


@pytest.fixture(scope="session")
def bases(docker_available: None) -> Bases:
    registry = os.environ.get("MBUILD_TEST_REGISTRY", "")
    oci = os.environ.get("MBUILD_TEST_BASE_OCI", "")
    if not oci or not Path(oci.removeprefix("oci:").rsplit(":", 1)[0], "index.json").is_file():
        require("no OCI layout of the base (MBUILD_TEST_BASE_OCI; .ci/local-base-image.sh makes it)")
    if not registry:
        require("no local registry (MBUILD_TEST_REGISTRY; .ci/start-registry.sh starts one)")
    try:
        httpx.get(f"http://{registry}/v2/", timeout=5).raise_for_status()
    except httpx.HTTPError:
        require(f"the registry at {registry} does not answer")
    return Bases(BASE_IMAGE, oci, registry, f"{registry}/{BASE_IMAGE}")


def tool(name: str, *probe: str) -> None:
    if not _ok(name, *probe):
        require(f"{name} is not usable here")


DOCKER_TAG = "mbuild-test/minilm:it"


def package_docker_image(hf_home: Path, out: Path) -> str:
    result = mbuild("package", "all-minilm-l6-v2", "--offline", "--backend", "docker", "--base-image", BASE_IMAGE,
                    "--name", "mbuild-test/minilm", "--version", "it", "--output", str(out),
                    env={"HF_HOME": str(hf_home)})
    log = out / "image-build.log"
    assert result.returncode == 0, result.stderr + (log.read_text()[-3000:] if log.exists() else "")
    return result.stderr


@pytest.fixture(scope="session")
def image_build(minilm_hf_home: Path, docker_available: None,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """MiniLM packaged into an image by the Docker engine, shared by the tests that run it."""
    out = tmp_path_factory.mktemp("minilm-image")
    output = package_docker_image(minilm_hf_home, out)
    assert DOCKER_TAG in output and "image id" in output
    yield out
    docker("rmi", "-f", DOCKER_TAG)


@pytest.fixture(scope="session")
def minilm_image(image_build: Path) -> str:
    return DOCKER_TAG
