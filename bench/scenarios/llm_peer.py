"""mbuild's language-model server against llama.cpp's `llama-server`: same weights, one pinned core, one thread.

Arms, per model shape, in precision pairs: mbuild fp32 / llama.cpp f32, mbuild int8 / q8_0, mbuild int4 / q4_0.
  mbuild     `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P`, MBUILD_THREADS=1
  llama.cpp  `llama-server --threads 1 --threads-batch 1 --parallel 16 --cont-batching`, a slot's context
             equal to mbuild's, on GGUFs converted by its own convert_hf_to_gguf.py (f32) and llama-quantize
Both serve random checkpoints with the real Llama SPM tokenizer (32000 tokens; bench/lib/llm_peer_shapes.py): a
~100M Llama, a Llama-3.2-1B-shaped one, a Qwen3-MoE (8 layers of 16 experts of 512, top-4, hidden 1024) and a wide
and shallow Llama (Llama-3.2-1B's layers, 4 of them). The Qwen3-MoE's GGUF comes from the same converter, its
vocabulary read from tokenizer.model as for the Llamas (bench/lib/llamacpp.py SPM_FIRST). Every request streams POST
/v1/completions with a 64-token text prompt (BOS included, checked against both servers' usage) and decodes exactly
64 tokens (ignore_eos, min_tokens), with `cache_prompt: false` for llama.cpp. At concurrency 1 requests go one after
another; at c >= 4 one wave of c is sent at once. The two servers of a pair share one pinned core (one measured at a
time), the client has another, the arms alternate.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from bench.lib import llamacpp, llm_peer_shapes
from bench.lib.harness import OUT, QUICK_OUT, fp32_peak_gflops, read_rate_gbs, work_folder, write
from bench.lib.llm_models import run_flops
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import build_arms, measure_pair
from bench.lib.llm_peer_report import plot, report
from bench.lib.llm_peer_shapes import KEYS, QUICK, Shape, chosen, make_model
from bench.lib.llm_peer_targets import Target
from bench.lib.mbuild import context_of
from bench.lib.servers import pinned, split_cores
from bench.lib.weight_bytes import experts_read, step_bytes

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "language models served, against llama.cpp's llama-server"

PAIRS = (("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0"))  # (mbuild precision, llama.cpp GGUF type)
PREFIX_PAIR = ("int8", "fp32")  # shared-prefix TTFT on mbuild's default precision, fp32 if int8 did not build
# issue 61's, at the top concurrency (the issue holds fp32 against the better of llama.cpp f32 and vLLM fp32:
# llm_vllm has vLLM's arms)
TARGETS = (Target("mbuild int8", ("llama.cpp q8_0",), 1.5), Target("mbuild fp32", ("llama.cpp f32",), 1.1))


def measure_shape(shape: Shape, work: Path, repeats: int, results: dict[str, Any], peer: bool) -> None:
    model = make_model(shape, work)
    files = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf") if peer else {}
    builds = build_arms(model, work, [mine for mine, _ in PAIRS], shape.key, results)
    results["step_bytes"][shape.key] = step_bytes(builds, files, experts_read(shape.config, 1))  # a MoE: its top-k
    results["prefix_pair"][shape.key] = next((p for p in PREFIX_PAIR if isinstance(builds[p], Path)), None)
    context = context_of(builds, model)
    results["context"][shape.key] = context
    config = json.loads((model / "config.json").read_text())
    results["run_flops"][shape.key] = run_flops(config, PROMPT_TOKENS, shape.new_tokens, max(shape.concurrency))
    texts = Texts(model)
    for mine, theirs in PAIRS:
        print(f"{shape.title}: mbuild {mine} against llama.cpp {theirs} (context {context} a sequence)")
        measure_pair(shape, (mine, theirs), builds[mine], files.get(theirs), context, texts, repeats, results)


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench llm_peer` (BENCH_PEER_SHAPES picks the shapes)."""
    parser = argparse.ArgumentParser(prog="python -m bench llm_peer",
                                     epilog=f"BENCH_PEER_SHAPES=100m,1b (the default) picks the shapes, of "
                                     f"{','.join(KEYS)}: ~100M Llama, Llama-3.2-1B-shaped, Qwen3-MoE, wide and "
                                     "shallow Llama")
    parser.add_argument("--smoke", action="store_true", help="check every arm serves the shapes: c=1, one request "
                        f"of 8 tokens, one round, the page in {QUICK_OUT}; the models, GGUFs and builds are the full "
                        "run's")
    return {"smoke": parser.parse_args(argv).smoke}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         smoke: bool = False) -> Path:
    """`python -m bench llm_peer [--smoke]`; BENCH_PEER_SHAPES=100m,1b,moe,wide picks the shapes (default 100m,1b).
    Quick: a tiny Llama, smoke-sized runs (bench/lib/llm_peer_shapes.py), mbuild alone where llama.cpp is not built.
    Smoke: the real shapes, one short request at c=1 (llm_peer_shapes.smoke), the page to the scratch folder."""
    work = work or work_folder("peer")
    keys = os.environ.get("BENCH_PEER_SHAPES", "100m,1b").split(",")
    shapes = [QUICK] if quick else [llm_peer_shapes.smoke(s) if smoke else s for s in chosen(keys)]
    mode = "quick" if quick else "smoke" if smoke else ""
    print(f"llama.cpp peer benchmark: work in {work}, {repeats} rounds{f' ({mode})' if mode else ''}")
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    peer = llamacpp.peer(quick)
    results: dict[str, Any] = {"runs": {}, "greedy": {}, "prefix": {}, "builds": {}, "context": {},
                               "prefix_pair": {}, "ungated": {}, "step_bytes": {}, "run_flops": {}}
    with pinned({min(split_cores()[1])}):  # the servers' core: the floors every server runs against
        results["read_gbs"], results["peak_gflops"] = read_rate_gbs(), fp32_peak_gflops()
    for shape in shapes:
        measure_shape(shape, work, repeats, results, peer)
    data, markdown = report(results, shapes, PAIRS, TARGETS, repeats, mode, __doc__ or "")
    out = QUICK_OUT if smoke and out == OUT else out
    path = write("llm_peer", data, markdown, out, measures=MEASURES)
    plot(results, shapes, PAIRS, out / "llm_peer.png")
    print(markdown)
    return path
