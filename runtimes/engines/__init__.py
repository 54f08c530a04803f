"""Engines, one per task, over sessions, one per backend (runtimes/engines/sessions.py).

engine.json's "task" picks the engine and its "engine" the session backend (onnxruntime, tensorrt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.bundle.engine import ENCODER_TASKS
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.encoder import EncoderEngine


class Encoder(Protocol):
    config: EngineConfig

    def warm_up(self) -> None: ...

    def run(self, batch: list[list[int]]) -> np.ndarray: ...


ENGINES: dict[str, type[EncoderEngine] | type[DecoderEngine]] = {
    "embedding": EncoderEngine,
    "rerank": EncoderEngine,
    "text-generation": DecoderEngine,
}


def encoder_for(model_dir: Path, config: EngineConfig, threads: int) -> EncoderEngine:
    if config.task not in ENCODER_TASKS:
        raise BundleError(f"engine.json says task {config.task!r}; an encoder (embedding or rerank) was asked for")
    return EncoderEngine(model_dir, config, threads)


def decoder_for(model_dir: Path, config: EngineConfig, threads: int, slots: int | None = None) -> DecoderEngine:
    if config.task != "text-generation":
        raise BundleError(f"engine.json says task {config.task!r}; a text-generation engine was asked for")
    return DecoderEngine(model_dir, config, threads, slots)
