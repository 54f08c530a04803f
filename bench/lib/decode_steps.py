"""Decode steps of the runtime's DecoderEngine timed at a given cached context, and a build's engine with an int8
and with an fp32 cache (builder/engine/kv_cache_quant.py), shared by `bench llm_context` and `bench kv_quant`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import onnx

from builder.engine.kv_cache_quant import calibrate, fp32_cache_graph, quantize_graph
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine

STEPS = 10


def engine(folder: Path, slots: int) -> DecoderEngine:
    return DecoderEngine(folder, load_engine_config(folder), threads=1, slots=slots)


def cache_type(folder: Path) -> str:
    """What an engine keeps keys and values in ("float32", "int8"): its graph's cache inputs say."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    kind = next(i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_"))
    return str(onnx.helper.tensor_dtype_to_np_dtype(kind))


def give_int8_cache(folder: Path) -> None:
    """Rewrite an engine folder in place to keep an 8-bit cache, calibrated on seeded random ids (timing needs no
    text); one that keeps it already is left as it is."""
    if cache_type(folder) == "int8":
        return
    vocab = load_engine_config(folder).decoder.vocab_size
    ids = np.random.default_rng(0).integers(0, vocab, (4, 256)).tolist()
    quantize_graph(folder / "model.onnx", calibrate(folder, ids, threads=1))


def int8_cache_engine(built: Path, out: Path, slots: int) -> DecoderEngine:
    """The build's engine copied to `out` with an 8-bit cache (made once)."""
    if not (out / "model.onnx").is_file():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(built, out)
        give_int8_cache(out)
    return engine(out, slots)


def fp32_cache_engine(built: Path, out: Path, slots: int) -> DecoderEngine:
    """The build's engine with an fp32 cache: the build's own where it keeps one (its gate failed before the int8
    cache, or its profile keeps fp32), else a copy in `out` with the int8 cache taken out (made once). A build whose
    int8 weights pass the gate ships its int8 cache, as it does on an AVX2 host's profile with random weights."""
    if cache_type(built) == "float32":
        return engine(built, slots)
    if not (out / "model.onnx").is_file():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(built, out)
        fp32_cache_graph(out / "model.onnx")
    return engine(out, slots)


def _filled(decoder: DecoderEngine, batch: int, context: int) -> np.ndarray:
    """The first `batch` slots holding `context` positions; the tokens of one decode step for them. The positions'
    values do not matter for timing, but their pages do: the engine's cache commits a page when a position is
    written (runtimes/engines/kv_memory.py), and a position never written reads from the kernel's one shared zero
    page, which stays in the core's cache, so an fp32 cache read that way cost about a tenth less here than one read
    from memory (measured at 2,047 positions). So the positions are written first."""
    for buffer in decoder.cache:
        buffer[:batch, :, :context] = 1
    return np.full((batch, 1), 5, np.int64)


def _step(decoder: DecoderEngine, tokens: np.ndarray, context: int) -> float:
    decoder.lengths[:] = 0
    decoder.lengths[:tokens.shape[0]] = context
    started = time.perf_counter()
    decoder.run(0, tokens)
    return time.perf_counter() - started


def step_ms(decoder: DecoderEngine, batch: int, context: int) -> float:
    """Median ms of one decode token in each of `batch` slots holding `context` positions, after two warm-up
    steps."""
    tokens = _filled(decoder, batch, context)
    times = [_step(decoder, tokens, context) for _ in range(STEPS + 2)]
    return float(np.median(times[2:]) * 1000)


def paired_ms(first: DecoderEngine, second: DecoderEngine, batch: int, context: int, steps: int
              ) -> tuple[float, float, float]:
    """(median ms of `first`, of `second`, median of second / first) over `steps` decode steps of each, one of
    each in turn. On a host whose speed drifts within seconds (seen here: the same pair of engines, timed in rounds
    of ten steps each, came out 0.63x in one run and 1.37x in the next, minutes apart), only steps taken side by side
    compare the two."""
    tokens = [_filled(engine, batch, context) for engine in (first, second)]
    for _ in range(2):
        _step(first, tokens[0], context), _step(second, tokens[1], context)
    pairs = [(_step(first, tokens[0], context), _step(second, tokens[1], context)) for _ in range(steps)]
    return (float(np.median([a for a, _ in pairs]) * 1000), float(np.median([b for _, b in pairs]) * 1000),
            float(np.median([b / a for a, b in pairs])))
