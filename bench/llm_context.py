"""Decode-step time against the context already cached: is the KV cache copied each step?

One random ~100M Llama (bench/llm_models.py), fp32 weights, two graphs run by the runtime's own
DecoderEngine, one intra-op thread, pinned to one core:
  in place      mbuild's ONNX Runtime graph (GroupQueryAttention, past and present bound to one buffer per
                slot): a step writes one position per sequence
  grown cache   the graph mbuild gives TensorRT (past in, past + 1 out, as the engine worked before), run on
                ONNX Runtime through the same slots: every step copies each sequence's whole cache in and out
Each row holds `context` cached positions (their values do not matter for timing) and decodes one token;
batch 1 and 8; rounds interleaved. An in-place step still reads every cached position once (attention
itself), so its time grows with the context by that read and no more.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from bench.harness import Series, interleave, machine, write
from bench.llm_models import make_llama_100m
from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder, export_decoder_tensorrt
from runtimes.bundle import EngineConfig
from runtimes.engines.decoder import DecoderEngine

CONTEXTS = (128, 512, 1024, 2047)  # cached positions; the step's token is the next one (2048 at most)
BATCHES = (1, 8)
STEPS = 10


def _engine(model: Path, out: Path, grown_cache: bool) -> DecoderEngine:
    export = export_decoder_tensorrt if grown_cache else export_decoder
    exported = export(model, out / "export")
    if not (out / "engine" / "model.onnx").is_file():
        optimize(out / "export" / "model.onnx", out / "engine" / "model.onnx")
    fields = exported.engine_fields("onnxruntime", "model.onnx", {"max_batch": max(BATCHES)})
    return DecoderEngine(out / "engine", EngineConfig.from_dict(fields), threads=1)


def _step_ms(engine: DecoderEngine, batch: int, context: int) -> float:
    tokens = np.full((batch, 1), 5, np.int64)
    times = []
    for _ in range(STEPS + 2):
        engine.lengths[:] = 0
        engine.lengths[:batch] = context
        started = time.perf_counter()
        engine.run(0, tokens)
        times.append(time.perf_counter() - started)
    return float(np.median(times[2:]) * 1000)


def main(repeats: int = 3, work: Path | None = None) -> Path:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    work = work or Path(tempfile.gettempdir()) / "mbuild-bench-llm-context"
    model = make_llama_100m(work / "llama-100m")
    engines = {"in place": _engine(model, work / "in-place", False),
               "grown cache": _engine(model, work / "grown-cache", True)}
    cases: list[tuple[str, Callable[[], float]]] = [
        (f"{name} b{batch} ctx{context}", partial(_step_ms, engine, batch, context))
        for name, engine in engines.items() for batch in BATCHES for context in CONTEXTS]
    results = interleave(cases, repeats)
    data = {"machine": machine(), "unit": "ms per decode step (lower is better)",
            "results": {k: v.values for k, v in results.items()}}
    return write("llm_context", data, _markdown(results, list(engines)))


def _markdown(results: dict[str, Series], names: list[str]) -> str:
    rows = []
    for name in names:
        for batch in BATCHES:
            base = results[f"{name} b{batch} ctx{CONTEXTS[0]}"].median
            cells = " | ".join(f"{results[f'{name} b{batch} ctx{c}'].median:.1f}" for c in CONTEXTS)
            longest = results[f"{name} b{batch} ctx{CONTEXTS[-1]}"].median
            rows.append(f"| {name} | {batch} | {cells} | {longest / base:.2f}x |")
    header = " | ".join(f"ctx {c}" for c in CONTEXTS)
    return f"""# Decode-step time against context length

{__doc__}
Machine: {machine()['cpu']}. Median ms per decode step over the rounds.

| graph | batch | {header} | longest / shortest |
| --- | ---: | {' | '.join('---:' for _ in CONTEXTS)} | ---: |
{chr(10).join(rows)}

Reproduce: `python -m bench llm_context` (writes docs/benchmarks/llm_context.json and .md).
"""
