"""Fixtures for tests that package the real MiniLM and run real servers and containers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from tests.conftest import MINILM_REPO
from tests.support.procs import mbuild

BASE_IMAGE = os.environ.get("MBUILD_TEST_BASE_IMAGE", "mbuild-local/python:3.11-bookworm")
TEXTS = ["hello world", "Containers package software with everything it needs to run.",
         "Prix: 12,50 € — déjà vu", "A longer passage about inference servers, health checks and batching. " * 5]


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


def docker_ready() -> str:
    """Empty when a Docker engine answers and the local base image exists, else the reason."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "no Docker engine answers (start one: .ci/start-dockerd.sh)"
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode:
        return f"base image {BASE_IMAGE} missing (make it: .ci/local-base-image.sh)"
    return ""


@pytest.fixture(scope="session")
def docker_available() -> None:
    reason = docker_ready()
    if reason:
        if os.environ.get("MBUILD_REQUIRE_DOCKER") == "1":
            pytest.fail(f"Docker is required here (MBUILD_REQUIRE_DOCKER=1) but: {reason}")
        pytest.skip(reason)
