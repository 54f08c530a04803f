"""mbuild's language-model server against llama.cpp's `llama-server`: same weights, one pinned core, one thread.

Arms, per model shape, in precision pairs: mbuild fp32 / llama.cpp f32, mbuild int8 / q8_0, mbuild int4 / q4_0.
  mbuild     `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P`, MBUILD_THREADS=1
  llama.cpp  `llama-server --threads 1 --threads-batch 1 --parallel 16 --cont-batching`, a slot's context
             equal to mbuild's, on GGUFs converted by its own convert_hf_to_gguf.py (f32) and llama-quantize
Both serve random Llamas with the real Llama SPM tokenizer (32000 tokens): a ~100M one and a Llama-3.2-1B-shaped
one. Every request streams POST /v1/completions with a 64-token text prompt (BOS included, checked against both
servers' usage) and decodes exactly 64 tokens (ignore_eos, min_tokens), with `cache_prompt: false` for
llama.cpp. At concurrency 1 requests go one after another; at c >= 4 one wave of c is sent at once. The two
servers of a pair share one pinned core (one measured at a time), the client has another, the arms alternate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.lib import llamacpp
from bench.lib.harness import OUT, fp32_peak_gflops, read_rate_gbs, work_folder, write
from bench.lib.llm_models import make_llama_spm, run_flops
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import build_arms, measure_pair
from bench.lib.llm_peer_report import plot, report
from bench.lib.llm_peer_shapes import QUICK, SHAPES, Shape
from bench.lib.mbuild import context_of
from bench.lib.servers import pinned, split_cores
from bench.lib.weight_bytes import step_bytes

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "language models served, against llama.cpp's llama-server"

PAIRS = (("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0"))  # (mbuild precision, llama.cpp GGUF type)
PREFIX_PAIR = ("int8", "fp32")  # shared-prefix TTFT on mbuild's default precision, fp32 if int8 did not build


def measure_shape(shape: Shape, work: Path, repeats: int, results: dict[str, Any], peer: bool) -> None:
    model = make_llama_spm(work / f"llama-{shape.key}-spm", shape.config, llamacpp.SPM_VOCAB)
    files = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf") if peer else {}
    builds = build_arms(model, work, [mine for mine, _ in PAIRS], shape.key, results)
    results["step_bytes"][shape.key] = step_bytes(builds, files)
    results["prefix_pair"][shape.key] = next((p for p in PREFIX_PAIR if isinstance(builds[p], Path)), None)
    context = context_of(builds, model)
    results["context"][shape.key] = context
    config = json.loads((model / "config.json").read_text())
    results["run_flops"][shape.key] = run_flops(config, PROMPT_TOKENS, shape.new_tokens, max(shape.concurrency))
    texts = Texts(model)
    for mine, theirs in PAIRS:
        print(f"{shape.title}: mbuild {mine} against llama.cpp {theirs} (context {context} a sequence)")
        measure_pair(shape, (mine, theirs), builds[mine], files.get(theirs), context, texts, repeats, results)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench llm_peer`; BENCH_PEER_SHAPES=100m,1b picks the shapes. Quick: a tiny Llama, smoke-sized
    runs (bench/lib/llm_peer_shapes.py), mbuild alone where llama.cpp is not built."""
    work = work or work_folder("peer")
    chosen = os.environ.get("BENCH_PEER_SHAPES", "100m,1b").split(",")
    shapes = [QUICK] if quick else [s for s in SHAPES if s.key in chosen]
    print(f"llama.cpp peer benchmark: work in {work}, {repeats} rounds{' (quick)' if quick else ''}")
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    peer = llamacpp.peer(quick)
    results: dict[str, Any] = {"runs": {}, "greedy": {}, "prefix": {}, "builds": {}, "context": {},
                               "prefix_pair": {}, "ungated": {}, "step_bytes": {}, "run_flops": {}}
    with pinned({min(split_cores()[1])}):  # the servers' core: the floors every server runs against
        results["read_gbs"], results["peak_gflops"] = read_rate_gbs(), fp32_peak_gflops()
    for shape in shapes:
        measure_shape(shape, work, repeats, results, peer)
    data, markdown = report(results, shapes, PAIRS, repeats, quick, __doc__ or "")
    path = write("llm_peer", data, markdown, out, measures=MEASURES)
    plot(results, shapes, PAIRS, out / "llm_peer.png")
    print(markdown)
    return path
