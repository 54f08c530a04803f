"""The GPU path end to end around TensorRT, with TensorRT and the GPU faked at their one edge.

What is real: export, the bundle layout, engine metadata, choosing the engine for the device, the
refusals, the gate, the GPU image's packages for Python 3.12 and the served API. What is not: the
TensorRT build and execution (the fake runs the ONNX graph with ONNX Runtime on the CPU).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions
from builder.cli import cli
from builder.progress import Reporter
from runtimes.api.app import create_app
from runtimes.bundle import load_engine_meta
from runtimes.bundle.tensorrt import TrtBuild
from runtimes.engines import tensorrt_engine
from runtimes.settings import Settings
from tests.support import fake_tensorrt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpu_build(tiny_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-build")
    with pytest.MonkeyPatch.context() as patch:
        fake_tensorrt.install(patch, (fake_tensorrt.H100,))
        package(PackageOptions(model=str(tiny_encoder), gpu="h100", output=out, backend="none"), Reporter(quiet=True))
    return out


def test_bundle_layout_and_metadata(gpu_build: Path) -> None:
    engine = json.loads((gpu_build / "model" / "engine.json").read_text())
    assert engine["engine"] == "tensorrt" and engine["model_file"] == "engines"
    meta = load_engine_meta(gpu_build / "model" / "engines" / "sm_90" / "engine-meta.json", "engine-meta.json")
    assert meta.tensorrt_version == fake_tensorrt.VERSION and meta.compute_capability == "9.0"
    assert meta.device_name == fake_tensorrt.H100.name and meta.build.precision_flags == ("FP16",)
    assert meta.gpu_model == "h100" and len(meta.timing_cache_sha256) == 64
    assert json.loads((gpu_build / "report.json").read_text())["passed"] is True
    requirements = (gpu_build / "requirements.txt").read_text()
    assert "onnxruntime-gpu==" in requirements and "cuda-python==" in requirements
    assert any((gpu_build / "site").glob("onnxruntime_gpu-*.dist-info"))  # cp312 wheels for the NVIDIA base
    dockerfile = (gpu_build / "Dockerfile").read_text()
    assert "FROM nvcr.io/nvidia/tensorrt:" in dockerfile and 'NVIDIA_VISIBLE_DEVICES="all"' in dockerfile


def _client(model_dir: Path) -> TestClient:
    return TestClient(create_app(Settings(model_dir=model_dir, host="127.0.0.1", port=8000, api_key=None,
                                          log_level="info", log_format="text", threads=1, max_queue=8,
                                          served_name=None)))


def _settle(client: TestClient) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while (body := client.get("/v1/health/ready").json())["status"] not in {"ready", "failed"}:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    result: dict[str, str] = body
    return result


def test_serves_on_the_gpu_it_was_built_for(gpu_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tensorrt.install(monkeypatch, (fake_tensorrt.H100,))
    with _client(gpu_build / "model") as client:
        assert _settle(client)["status"] == "ready"
        assert len(client.post("/v1/embeddings", json={"input": "hello"}).json()["data"][0]["embedding"]) == 32


@pytest.mark.parametrize(("gpus", "version", "reason"), [
    ((fake_tensorrt.L4,), fake_tensorrt.VERSION, "this GPU (NVIDIA L4) is sm_89"),
    ((fake_tensorrt.H100,), "10.11.0", "this image runs TensorRT 10.11.0"),
    ((), fake_tensorrt.VERSION, "no NVIDIA GPU is visible"),
])
def test_refuses_other_hardware_and_never_gets_ready(gpu_build: Path, monkeypatch: pytest.MonkeyPatch,
                                                     gpus: tuple[fake_tensorrt.GpuInfo, ...], version: str,
                                                     reason: str) -> None:
    fake_tensorrt.install(monkeypatch, gpus, version)
    with _client(gpu_build / "model") as client:
        state = _settle(client)
        assert state["status"] == "failed" and reason in state["reason"]
        assert client.get("/v1/health/ready").status_code == 503


def test_an_engine_meta_of_another_format_is_refused_and_never_gets_ready(
        gpu_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    shutil.copytree(gpu_build / "model", model)
    path = model / "engines" / "sm_90" / "engine-meta.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 2}))
    fake_tensorrt.install(monkeypatch, (fake_tensorrt.H100,))
    with _client(model) as client:
        state = _settle(client)
    assert state["status"] == "failed"
    assert "engines/sm_90/engine-meta.json: it is format 2; this mbuild reads format 1" in state["reason"]
    assert "rebuild the engine for this GPU" in state["reason"]


def test_a_build_at_start_is_told_the_settings_engine_meta_json_keeps(
        gpu_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    shutil.copytree(gpu_build / "model", model)
    shutil.copy(model / "engines" / "sm_90" / "engine.plan", model / "model.onnx")  # the fake's plan is the graph
    fake_tensorrt.install(monkeypatch, (fake_tensorrt.L4,))
    told: list[TrtBuild] = []

    def build_plan(onnx: Path, settings: TrtBuild, cache: Path) -> bytes:
        told.append(settings)
        return fake_tensorrt.fake_build_plan(onnx, settings, cache)

    monkeypatch.setattr(tensorrt_engine, "build_plan", build_plan)
    monkeypatch.setenv("MBUILD_TRT_BUILD_AT_START", "1")
    with _client(model) as client:
        assert _settle(client)["status"] == "ready"
    assert told == [load_engine_meta(model / "engines" / "sm_90" / "engine-meta.json", "engine-meta.json").build]


def test_building_without_the_target_gpu_says_so(tiny_encoder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tensorrt.install(monkeypatch, (fake_tensorrt.L4,))
    result = CliRunner().invoke(cli, ["package", str(tiny_encoder), "--gpu", "h100", "--backend", "none",
                                      "--output", str(tmp_path)])
    assert result.exit_code == 9
    assert "must be built on a sm_90 GPU, and this host has NVIDIA L4 (sm_89)" in result.output


def test_explicit_quantization_is_refused_clearly(tiny_encoder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tensorrt.install(monkeypatch, (fake_tensorrt.H100,))
    result = CliRunner().invoke(cli, ["package", str(tiny_encoder), "--gpu", "h100", "--precision", "int8",
                                      "--backend", "none", "--output", str(tmp_path)])
    assert result.exit_code == 9 and "Q/DQ" in result.output
