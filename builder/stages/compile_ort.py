"""CPU compile: ONNX Runtime's graph optimizer, run once at build time and saved as the engine."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from builder.errors import InputError

# "extended" fuses attention, layer norm and GELU and stays portable across x86-64 CPUs;
# "all" adds layout changes tied to the build host's CPU, so it is not the default.
LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def optimize(source: Path, engine_file: Path, level: str = "extended") -> Path:
    if level not in LEVELS:
        raise InputError(f"graph_optimization {level!r} is not one of {sorted(LEVELS)}")
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.optimized_model_filepath = str(engine_file)
    engine_file.parent.mkdir(parents=True, exist_ok=True)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return engine_file
