"""Inference engines, one per backend and task, listed in ENGINES.

To add one: implement the engine and add it here; engine.json's "engine" and "task" pick it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.ort_decoder import OrtDecoderEngine
from runtimes.engines.ort_encoder import OrtEncoderEngine


class EncoderEngine(Protocol):
    config: EngineConfig

    def warm_up(self) -> None: ...

    def run(self, batch: list[list[int]]) -> np.ndarray: ...


ENGINES: dict[tuple[str, str], type[OrtEncoderEngine] | type[OrtDecoderEngine]] = {
    ("onnxruntime", "embedding"): OrtEncoderEngine,
    ("onnxruntime", "text-generation"): OrtDecoderEngine,
}


def encoder_for(model_dir: Path, config: EngineConfig, threads: int) -> OrtEncoderEngine:
    engine = ENGINES.get((config.engine, config.task))
    if engine is not OrtEncoderEngine:
        raise BundleError(f"no embedding engine {config.engine!r}; known: {sorted(ENGINES)}")
    return OrtEncoderEngine(model_dir, config, threads)


def decoder_for(model_dir: Path, config: EngineConfig, threads: int) -> OrtDecoderEngine:
    engine = ENGINES.get((config.engine, config.task))
    if engine is not OrtDecoderEngine:
        raise BundleError(f"no text-generation engine {config.engine!r}; known: {sorted(ENGINES)}")
    return OrtDecoderEngine(model_dir, config, threads)
