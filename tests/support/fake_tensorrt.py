"""A stand-in for TensorRT and the GPU at their one edge (runtimes.engines.tensorrt_engine and NVML).

TensorRT cannot be installed here and there is no GPU, so these fakes keep everything around them
real: the "plan" a fake build writes is the ONNX graph itself, and the fake session runs it with
ONNX Runtime on the CPU. Nothing here counts as proof that the TensorRT path works on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from builder.engine import compile_tensorrt
from runtimes.bundle.tensorrt import TrtBuild
from runtimes.engines import sessions, tensorrt_engine
from runtimes.hardware import GpuInfo

H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80)
L4 = GpuInfo("NVIDIA L4", "8.9", 23)
VERSION = "10.13.0.35"


class FakeTrtSession:
    def __init__(self, plan_path: Path) -> None:
        self.session = ort.InferenceSession(str(plan_path), providers=["CPUExecutionProvider"])

    def get_inputs(self) -> Sequence[Any]:
        return list(self.session.get_inputs())

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.session.run(list(output_names) if output_names else None, feeds))


def fake_build_plan(onnx_path: Path, settings: TrtBuild, timing_cache: Path) -> bytes:
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    timing_cache.write_bytes(b"timing cache of the fake")
    return onnx_path.read_bytes()


def install(monkeypatch: pytest.MonkeyPatch, gpus: tuple[GpuInfo, ...], version: str | None = VERSION) -> None:
    monkeypatch.setattr(tensorrt_engine, "trt_version", lambda: version)
    monkeypatch.setattr(tensorrt_engine, "TrtSession", FakeTrtSession)
    monkeypatch.setattr(tensorrt_engine, "use_device", lambda index: None)
    monkeypatch.setattr(tensorrt_engine, "build_plan", fake_build_plan)
    monkeypatch.setattr(sessions, "detect_gpus", lambda: gpus)
    monkeypatch.setattr(compile_tensorrt, "detect_gpus", lambda: gpus)
