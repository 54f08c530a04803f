"""Decode-step time against the context already cached: is the KV cache copied each step?

The random Llamas of `bench llm_peer` (real Llama SPM tokenizer): the ~100M one and the Llama-3.2-1B-shaped one.
mbuild's arms run the runtime's own DecoderEngine, one intra-op thread, pinned to one core:
  fp32 / int8   the engines `mbuild package --precision fp32` and `--precision int8` (int8 is the default CPU
                precision) build, with their fp32 KV caches (what the int8 build gates first): ONNX Runtime graphs
                with GroupQueryAttention, past and present bound to one buffer per slot, so a step writes one
                position per sequence
  int8, int8 cache  the int8 engine with an 8-bit KV cache, as the int8 profile ships it where its gate passes
                (builder/engine/kv_cache_quant.py: scales calibrated on its own fp32 cache, here for random token
                ids, the graph told to keep int8 keys and values)
  grown cache   (~100M only) the fp32 graph mbuild gives TensorRT (past in, past + 1 out, as the engine worked
                before), run on ONNX Runtime through the same slots: every step copies each sequence's cache
Each mbuild row holds `context` cached positions, written before timing (their values do not matter, their memory
pages do: decode_steps.step_ms) and decodes one token.
llama.cpp's arms are its own `llama-batched-bench` on the f32 and q8_0 GGUFs of the same weights, one thread,
the same core, its defaults otherwise (an f16 KV cache, flash attention auto): it prefills `context` tokens in
each of B sequences, then times 16 decode steps of all B (from `context` to `context` + 16 cached).
Batch 1 and 8; the mbuild arms' rounds interleaved. A step that copies nothing still reads every cached
position once (attention itself), so its time grows with the context by that read: with fp32 weights on the
1B shape the weights dominate that read; at batch 8 on the ~100M shape (kv width 320, 12 layers) the cache read
is as large as the weights' (0.5 GB at context 2047), and halves only with a narrower cache (llama.cpp's f16;
ONNX Runtime's CPU GroupQueryAttention runs an f16 cache slower than an fp32 one, converting every element).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib import decode_steps, llamacpp
from bench.lib.harness import OUT, Series, interleave, machine, read_rate_gbs, work_folder, write
from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY, make_llama_spm
from bench.lib.mbuild import build_or_engine
from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder_tensorrt
from runtimes.bundle import Batching
from runtimes.engines.decoder import DecoderEngine

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "decode-step time against cached context, beside llama.cpp"

CONTEXTS = (128, 512, 1024, 2047)  # cached positions; the step's token is the next one (2048 at most)
BATCHES = (1, 8)
TG = 16  # llama-batched-bench's decode steps per row
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {"100m": ("random ~100M Llama", LLAMA_100M),
                                               "1b": ("random Llama-3.2-1B-shaped", LLAMA_1B),
                                               "tiny": ("random tiny Llama (quick)", LLAMA_TINY)}
MEASURED = "100m,1b"  # the shapes a full run measures; a quick one runs the tiny one alone
PEER = ("f32", "q8_0")
BOUND = 1.3  # issue 15's bound on the step at the longest context over the step at the shortest


def _cache_bytes(shape: dict[str, Any], batch: int, context: int, element: int) -> int:
    """Bytes of keys and values one decode step's attention reads: every cached position of every layer."""
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    return batch * context * shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * element


def _grown_cache_engine(model: Path, out: Path) -> DecoderEngine:
    exported = export_decoder_tensorrt(model, out / "export")
    if not (out / "engine" / "model.onnx").is_file():
        optimize(out / "export" / "model.onnx", out / "engine" / "model.onnx")
    config = exported.engine_config("onnxruntime", "model.onnx", "fp32", Batching(max(BATCHES), 0))
    return DecoderEngine(out / "engine", config, threads=1)


def _measure_shape(key: str, work: Path, repeats: int, peer: bool) -> dict[str, Series]:
    title, shape = SHAPES[key]
    model = make_llama_spm(work / f"llama-{key}-spm", shape, llamacpp.SPM_VOCAB)
    engines: dict[str, DecoderEngine] = {}
    for precision in ("fp32", "int8"):
        built, _ = build_or_engine(model, work, precision, planned_cache=False)
        if isinstance(built, Path):
            engines[f"mbuild {precision}"] = decode_steps.fp32_cache_engine(built / "model",
                                                                           work / f"{built.name}-fp32-cache",
                                                                           max(BATCHES))
            if precision == "int8":
                cached = work / f"{built.name}-int8-cache"
                engines["mbuild int8, int8 cache"] = decode_steps.int8_cache_engine(built / "model", cached,
                                                                                   max(BATCHES))
    if key != "1b":
        engines["mbuild fp32 grown cache"] = _grown_cache_engine(model, work / "grown-cache")
    cases: list[tuple[str, Callable[[], float]]] = [
        (f"{name} b{batch} ctx{context}", partial(decode_steps.step_ms, engine, batch, context))
        for name, engine in engines.items() for batch in BATCHES for context in CONTEXTS]
    print(f"{title}: {', '.join(engines)}" + (f"; then llama.cpp {', '.join(PEER)}" if peer else ""))
    results = interleave(cases, repeats)
    engines.clear()
    if not peer:
        return results
    ggufs = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf")
    for kind in PEER:
        series = {f"llama.cpp {kind} b{b} ctx{c}": Series() for b in BATCHES for c in CONTEXTS}
        for _ in range(1 if key == "1b" else repeats):  # the 1B shape's prefills take minutes a round
            for (batch, context), ms in llamacpp.batched_steps(ggufs[kind], BATCHES, CONTEXTS, TG).items():
                series[f"llama.cpp {kind} b{batch} ctx{context}"].values.append(ms)
        results.update(series)
    return results


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench llm_context`; BENCH_CONTEXT_SHAPES=100m or 1b picks the shapes. Quick: the tiny Llama,
    mbuild alone where llama.cpp is not built."""
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    rate = read_rate_gbs()
    work = work or work_folder("peer")  # shares llm_peer's models and builds
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    peer = llamacpp.peer(quick)
    chosen = ["tiny"] if quick else os.environ.get("BENCH_CONTEXT_SHAPES", MEASURED).split(",")
    results = {key: _measure_shape(key, work, repeats, peer) for key in SHAPES if key in chosen}
    data: dict[str, Any] = {"machine": machine(), "unit": "ms per decode step (lower is better)", "read_gbs": rate,
                            "results": {key: {k: v.values for k, v in r.items()} for key, r in results.items()}}
    return write("llm_context", data, _markdown(results, rate), out, measures=MEASURES)


def _floor_rows(key: str, series: dict[str, Series], names: list[str], rate: float) -> list[str]:
    """Per arm and batch: the growth measured, the cache bytes it adds, and how long reading them takes at `rate`."""
    shape, short, long = SHAPES[key][1], CONTEXTS[0], CONTEXTS[-1]
    rows = []
    for name in (n for n in names if "grown" not in n):  # the grown-cache arm copies; its floor is not the read
        # llama.cpp's default cache is f16, mbuild's fp32 unless the arm keeps an int8 one
        element = 2 if name.startswith("llama.cpp") else 1 if name.endswith("int8 cache") else 4
        for batch in BATCHES:
            first, last = series[f"{name} b{batch} ctx{short}"].median, series[f"{name} b{batch} ctx{long}"].median
            added = _cache_bytes(shape, batch, long, element) - _cache_bytes(shape, batch, short, element)
            growth = last - first
            read_at = f"{added / growth / 1e6:.1f}" if growth > 0 else "-"  # noise can exceed a small growth
            rows.append(f"| {name} | {batch} | {growth:.1f} | {added / 1e6:.0f} | {added / rate / 1e6:.1f} | "
                        f"{(BOUND - 1) * first:.1f} | {read_at} |")
    return rows


def _markdown(results: dict[str, dict[str, Series]], rate: float) -> str:
    sections = []
    for key, series in results.items():
        names = list(dict.fromkeys(k.rsplit(" b", 1)[0] for k in series))
        rows = []
        for name in names:
            for batch in BATCHES:
                cells = [series[f"{name} b{batch} ctx{c}"].median for c in CONTEXTS]
                rows.append(f"| {name} | {batch} | {' | '.join(f'{v:.1f}' for v in cells)} | "
                            f"{cells[-1] / cells[0]:.2f}x |")
        header = " | ".join(f"ctx {c}" for c in CONTEXTS)
        sections.append(f"""## {SHAPES[key][0]}

| arm | batch | {header} | longest / shortest |
| --- | ---: | {' | '.join('---:' for _ in CONTEXTS)} | ---: |
{chr(10).join(rows)}

From {CONTEXTS[0]} to {CONTEXTS[-1]} cached positions: the step's growth, the cache bytes that adds to every step,
the least time reading them takes at one core's read rate ({rate:.1f} GB/s), the growth a {BOUND}x bound allows,
and the rate at which the measured growth read its bytes.

| arm | batch | growth ms | cache MB added | read at {rate:.0f} GB/s, ms | {BOUND}x allows, ms | growth read at, GB/s |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(_floor_rows(key, series, names, rate))}
""")
    return f"""# Decode-step time against context length

{__doc__}
Machine: {machine()['cpu']}, {machine()['date']}. Median ms per decode step over the rounds (llama.cpp: one
round on the 1B shape). One core's read rate, {rate:.1f} GB/s, is the best of 5 numpy maxima over 1 GiB on the
pinned core: where reading the added cache at that rate takes longer than the bound allows, no engine that reads
this cache (fp32 for mbuild, f16 for llama.cpp) can meet the bound on this machine; where it takes less, the gap
between the growth and that floor is the attention kernel's.

{chr(10).join(sections)}
Reproduce: `python -m bench llm_context` (writes docs/benchmarks/llm_context.json and .md; it reuses
`bench llm_peer`'s models, builds and llama.cpp, building what is missing).
"""
