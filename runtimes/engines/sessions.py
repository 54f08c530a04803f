"""Sessions, one per backend, listed in SESSIONS: what runs a graph. Engines (encoder, decoder) sit on top.

To add a backend: write a function that opens a session with `run(names, feeds)` and `get_inputs()`,
and add it here; engine.json's "engine" names it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from runtimes.bundle import BundleError, EngineConfig
from runtimes.bundle.engine import ENCODER_TASKS
from runtimes.engines import gpu_select, tensorrt_engine
from runtimes.hardware import detect_gpus
from runtimes.kernels import LIBRARY_FILE, NO_AMX_ENTRY
from runtimes.settings import flag

log = logging.getLogger("mbuild.runtime")


class Session(Protocol):
    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> Sequence[Any]: ...

    def get_inputs(self) -> Sequence[Any]: ...


def _onnxruntime(model_dir: Path, config: EngineConfig, threads: int) -> Session:
    path = model_dir / config.model_file
    if not path.is_file():
        raise BundleError(f"engine file {path} is missing")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if config.task in ENCODER_TASKS:
        # Idle intra-op threads spin by default, taking the core the event loop needs to answer the last
        # batch and gather the next; the service then sheds ~20% of its throughput (bench/scenarios/serving.py).
        # Decoders keep spinning: a decode step is hundreds of tiny ops, where waking threads would cost.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The graph was optimized at build time; repeating it here would only slow the start.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    kernels = model_dir / LIBRARY_FILE  # mbuild's own kernels, built with the engine for its CPU
    if flag("MBUILD_NO_AMX"):
        options.add_session_config_entry(NO_AMX_ENTRY, "1")
    try:
        if kernels.is_file():
            options.register_custom_ops_library(str(kernels))
    except Exception as exc:  # the library refuses a CPU without its instructions, saying so
        raise BundleError(f"cannot load the engine's kernels {kernels}: {exc}") from exc
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        raise BundleError(f"ONNX Runtime cannot load {path}: {exc}") from exc


def _tensorrt(model_dir: Path, config: EngineConfig, threads: int) -> Session:
    gpus = detect_gpus()
    try:
        engine = gpu_select.choose_engine(model_dir, gpus[0] if gpus else None, tensorrt_engine.trt_version())
    except BundleError:
        if not flag("MBUILD_TRT_BUILD_AT_START"):
            raise
        return _build_at_start(model_dir, config)
    try:
        return tensorrt_engine.TrtSession(engine.plan)
    except (tensorrt_engine.TensorRTUnavailable, RuntimeError) as exc:
        raise BundleError(str(exc)) from exc


def _build_at_start(model_dir: Path, config: EngineConfig) -> Session:
    """Opt-in only (MBUILD_TRT_BUILD_AT_START=1): slow starts are what users complain about."""
    source = model_dir / "model.onnx"
    if not source.is_file():
        raise BundleError("MBUILD_TRT_BUILD_AT_START=1, but the bundle has no model.onnx to build from")
    settings = gpu_select.built_engines(model_dir)[0].meta.build
    log.warning("BUILDING A TENSORRT ENGINE AT START (MBUILD_TRT_BUILD_AT_START=1): this takes minutes; "
                "package for this GPU instead to start in seconds")
    plan = Path("/tmp/mbuild-engine.plan")
    plan.write_bytes(tensorrt_engine.build_plan(source, settings, Path("/tmp/mbuild-timing.cache")))
    return tensorrt_engine.TrtSession(plan)


SESSIONS: dict[str, Callable[[Path, EngineConfig, int], Session]] = {
    "onnxruntime": _onnxruntime,
    "tensorrt": _tensorrt,
}


def open_session(model_dir: Path, config: EngineConfig, threads: int) -> Session:
    opener = SESSIONS.get(config.engine)
    if opener is None:
        raise BundleError(f"engine {config.engine!r} is not one of {sorted(SESSIONS)}")
    return opener(model_dir, config, threads)
