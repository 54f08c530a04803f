"""Inference engines, one per backend, listed in ENGINES. To add one: implement Engine, add it here."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from runtimes.bundle import EngineConfig
from runtimes.engines.ort_encoder import OrtEncoderEngine


class Engine(Protocol):
    config: EngineConfig

    def warm_up(self) -> None: ...

    def run(self, batch: list[list[int]]) -> np.ndarray: ...


class EngineFactory(Protocol):
    def __call__(self, model_dir: Path, config: EngineConfig, threads: int) -> Engine: ...


ENGINES: dict[str, EngineFactory] = {
    "onnxruntime": OrtEncoderEngine,
}
