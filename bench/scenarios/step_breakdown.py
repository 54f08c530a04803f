"""Where a decode step's time goes at 1 and 16 rows, on four shapes: matmuls, attention, LM head, sampling, scheduling.

Each shape is a random checkpoint (fp32, a word-level tokenizer of its vocabulary) built by mbuild's own CPU pipeline
at mbuild's default precision here, int8 (`mbuild package --backend none --gpu cpu --precision int8`, the gate
included; where the gate fails on random weights, the engine as built, as `mbuild serve --allow-failed-gate` serves
it), the ~100M shape at fp32 too, a default path where a model's int8 fails its gate, and in int8 as the fallbacks
build it (VARIANTS: the AVX2 CPUs' int8 profile, and the default where mbuild's kernel library cannot be built),
so that what they cost is measured on this core, not assumed. Then, one intra-op thread on
one pinned core, c=1 and c=16 rows decoding, each row after a 64-token prompt of random ids, two views of a step:
  served      the runtime's engine loop over the bundle's DecoderEngine, loaded as the server loads it, driven tick by
              tick in process with greedy requests (bench/lib/step_parts.py): each tick timed whole, and its
              scheduling (plan_step), ONNX Runtime's session call, the Python around that call (packing, binding),
              sampling (next_token, per row) and the rest of apply (events, metrics); the mean over --steps ticks
  profiled    ONNX Runtime's profiler over the same engine's decode steps (bench/lib/step_profile.py): ms per op type,
              the LM head apart
The session's time in the served step is split in the profiled shares. Each matmul op type's FLOPs (2 x rows x K x N
over its nodes, from the graph's weights; a mixture of experts' top-k experts a row) over its profiled ms is its
rate, against the core's peak at its precision measured here: fp32, the best of torch's and ONNX Runtime's fp32
matmul (bench/lib/harness.py's fp32_peak_gflops); int8, the kernel the default int8 builds' linear layers run (the
fallbacks' kernels are held to it too), alone, at 512 rows of Llama-3.2-1B's MLP matrices
(bench/lib/matmul_kernels.py).
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnxruntime as ort

from bench.lib.harness import OUT, PEAK_SHAPES, fp32_peak_gflops, machine, work_folder, write
from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY, VOCAB, make_words_decoder
from bench.lib.llm_peer_shapes import MOE, WIDE  # shared with the peer comparisons
from bench.lib.matmul_kernels import kernel_peak_gflops
from bench.lib.mbuild import build_or_engine, plan
from bench.lib.servers import pinned, split_cores
from bench.lib.step_parts import LM_HEAD, WARM, loop_steps, matmul_flops, parts, rates
from bench.lib.step_profile import step_profile
from builder.engine import int8_tiles

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "where a decode step's time goes at c=1 and c=16, four shapes"

BATCHES = (1, 16)
PROMPT = 64
STEPS, QUICK_STEPS = 16, 2
SMALL_VOCAB = 8000
TINY_MOE = {**LLAMA_TINY, "head_dim": 32, "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
# the kernel of an int8 build's linear layers -> its arm in bench/lib/matmul_kernels.py
INT8_ARMS = {int8_tiles.OP: "int8 mbuild tiles b128", "MatMulNBits": "int8 MatMulNBits b128",
             "DynamicQuantizeMatMul": "int8 dynamic"}
QUICK_PEAK_SHAPES = ((64, 256, 512),)


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    model: str  # the checkpoint's folder in the work folder (the fp32 case shares its int8 case's)
    model_type: str
    shape: dict[str, Any]
    vocab: int
    precision: str = "int8"
    variant: str = ""  # a build other than the default's (VARIANTS), same checkpoint


# the fallbacks, measured on this core: the int8 profile mbuild picks on an AVX2 CPU (dynamic int8 with 7-bit weights,
# ONNX Runtime's GroupQueryAttention), and the default profile where mbuild's kernel library cannot be built (a
# compiler that fails: MatMulNBits on the same 8-bit blocks, GroupQueryAttention), in a cache of their own
VARIANTS = {"avx2": lambda work: {"MBUILD_PROFILE": "onnxruntime-cpu-int8-tp1-throughput"},
            "no-kernels": lambda work: {"CXX": "/bin/false", "MBUILD_CACHE": str(work / "cache-no-kernels")}}


CASES = {case.key: case for case in (
    Case("100m", "llm_peer's ~100M Llama", "llama-100m", "llama", LLAMA_100M, VOCAB),
    Case("100m-fp32", "llm_peer's ~100M Llama", "llama-100m", "llama", LLAMA_100M, VOCAB, "fp32"),
    Case("100m-avx2", "llm_peer's ~100M Llama, the AVX2 CPUs' int8 profile", "llama-100m", "llama", LLAMA_100M, VOCAB,
         variant="avx2"),
    Case("100m-no-kernels", "llm_peer's ~100M Llama, mbuild's kernels not built", "llama-100m", "llama", LLAMA_100M,
         VOCAB, variant="no-kernels"),
    Case("1b", "Llama-3.2-1B's shape", "llama-1b", "llama", LLAMA_1B, VOCAB),
    Case("wide", "wide and shallow: Llama-3.2-1B's layers, 4 of them, 8000 words", "llama-wide", "llama", WIDE,
         SMALL_VOCAB),
    Case("moe", "Qwen3-MoE: 8 layers of 16 experts of 512, top-4, hidden 1024, 8000 words", "qwen3-moe",
         "qwen3_moe", MOE, SMALL_VOCAB))}
QUICK_CASES = ("100m", "100m-fp32", "moe")


def tiny(case: Case) -> Case:
    """A quick run's stand-in of the case: the tiny Llama, or a tiny Qwen3-MoE, on 512 words."""
    moe = case.model_type == "qwen3_moe"
    return replace(case, title=f"{case.title} (quick: tiny)", model=f"{case.model_type}-tiny",
                   shape=TINY_MOE if moe else LLAMA_TINY, vocab=512)


def _build(case: Case, work: Path) -> dict[str, Any]:
    """The case's bundle (or why it did not build), its gate's summary where it failed, and mbuild's default
    precision for its checkpoint on this CPU."""
    model = make_words_decoder(work / case.model, case.model_type, case.shape, case.vocab)
    print(f"{case.key}: building mbuild {case.precision}", flush=True)
    started = time.perf_counter()
    env = VARIANTS[case.variant](work) if case.variant else None
    bundle, gate = build_or_engine(model, work, case.precision, env, variant=case.variant)
    default = ((plan(model).get("profile") or {}).get("content") or {}).get("precision")
    print(f"{case.key}: {'built' if isinstance(bundle, Path) else 'did not build'} in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return {"bundle": bundle, "gate": gate, "default_precision": default}


def measure(bundle: Path, steps: int, peaks: dict[str, float], batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """Both views of a step of the bundle's engine at each batch, joined (bench/lib/step_parts.py), on the calling
    thread's cores."""
    model_dir = bundle / "model"
    profiles = {str(batch): step_profile(model_dir, batch, PROMPT, steps) for batch in batches}
    gc.collect()
    served = loop_steps(model_dir, batches, PROMPT, steps)
    flops = matmul_flops(model_dir / "model.onnx")
    return {"flops": flops, "profile": profiles, "served": served,
            "parts": {b: parts(served[b], profiles[b]) for b in profiles},
            "matmuls": {b: rates(flops, profiles[b], int(b), peaks) for b in profiles}}


def _peaks(built: dict[str, dict[str, Any]], quick: bool) -> dict[str, dict[str, Any]]:
    """The core's fp32 peak, and its int8 peak on the kernel the int8 builds' linear layers run (mbuild's tiles
    where a build holds them)."""
    shapes = QUICK_PEAK_SHAPES if quick else PEAK_SHAPES[2:]
    found = {"fp32": {"gflops": fp32_peak_gflops(1, shapes, 2 if quick else 4),
                      "kernel": "the best of torch's and ONNX Runtime's fp32 matmul"}}
    ops = {matmul["op"] for entry in built.values() if isinstance(entry["bundle"], Path)
           for matmul in matmul_flops(entry["bundle"] / "model" / "model.onnx").values()
           if matmul["precision"] == "int8"}
    arm = next((name for op, name in INT8_ARMS.items() if op in ops), None)
    if arm is not None:
        found["int8"] = {"gflops": kernel_peak_gflops(arm, shapes, 2 if quick else 4), "kernel": arm}
    rows, k, n = shapes[0]
    print(f"core peaks at {rows} rows of [{k}, {n}]: " + ", ".join(f"{p} {v['gflops']:.0f} GFLOP/s ({v['kernel']})"
                                                                   for p, v in found.items()), flush=True)
    return found


def _ms(value: float, step: float) -> list[str]:
    return [f"{value:.2f}", f"{100 * value / step:.1f}%"]


def parts_table(case: dict[str, Any]) -> list[str]:
    """| part | ms and share at each batch |, the step first, then its parts in step_parts.parts' order."""
    batches = list(case["served"])
    head = case["flops"].get(LM_HEAD, {}).get("op")
    lines = ["| part | " + " | ".join(f"c={b} ms | c={b} share" for b in batches) + " |",
             "| --- |" + " ---: | ---: |" * len(batches),
             "| **step** (one engine-loop tick) | " + " | ".join(
                 f"**{case['served'][b]['step']:.2f}** | {int(b) * 1000 / case['served'][b]['step']:.0f} tokens/s"
                 for b in batches) + " |"]
    named = list(dict.fromkeys(name for b in batches for name in case["parts"][b]))
    for name in named:
        label = f"{LM_HEAD} ({head})" if name == LM_HEAD and head else name
        cells = [" | ".join(_ms(case["parts"][b].get(name, 0.0), case["served"][b]["step"])) for b in batches]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def matmul_table(case: dict[str, Any], peaks: dict[str, dict[str, Any]]) -> list[str]:
    """| matmul | precision | nodes | GFLOP a step, ms, GFLOP/s and share of the core's peak at each batch |"""
    batches = list(case["matmuls"])
    lines = ["| matmul | precision | nodes | " + " | ".join(
        f"c={b} GFLOP | c={b} ms | c={b} GFLOP/s | c={b} of peak" for b in batches) + " |",
        "| --- | --- | ---: |" + " ---: | ---: | ---: | ---: |" * len(batches)]
    for key, entry in case["flops"].items():
        label = key if key == entry["op"] else f"{key} ({entry['op']})"
        cells = []
        for b in batches:
            rate = case["matmuls"][b].get(key)
            share = rate and rate["peak_share"]
            cells.append("- | - | - | -" if rate is None else
                         f"{rate['gflop']:.3f} | {rate['ms']:.2f} | {rate['gflops']:.0f} | "
                         + (f"{100 * share:.1f}%" if share else "-"))
        lines.append(f"| {label} | {entry['precision']} | {entry['nodes']} | " + " | ".join(cells) + " |")
    peak = ", ".join(f"{precision} {value['gflops']:.0f} GFLOP/s" for precision, value in peaks.items())
    return [*lines, "", f"Peaks: {peak}."]


def _case_section(key: str, case: dict[str, Any], peaks: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"## {case['title']}: mbuild {case['precision']} ({key})", "", _shape_line(case["shape"], case["vocab"])]
    if "reason" in case:
        return [*lines, "", f"Did not build: {case['reason']}", ""]
    gate = (f"Its {case['precision']} engine failed the gate on these random weights ({case['gate']}); measured as "
            "built, as `mbuild serve --allow-failed-gate` serves it." if case["gate"] else "Built and gated.")
    served = ", ".join(f"c={b} {case['served'][b]['ONNX Runtime']:.2f} ms served, {case['profile'][b]['step_ms']:.2f}"
                       " profiled" for b in case["served"])
    return [*lines, f"mbuild's default precision for it here: {case['default_precision']}. {gate}", "",
            *parts_table(case), "", f"ONNX Runtime's session a step: {served} (its parts above are the served time "
            "split in the profiled shares).", "", "Each matmul against the core's peak at its precision (its kernels' "
            "profiled ms):", "", *matmul_table(case, peaks), ""]


def _shape_line(shape: dict[str, Any], vocab: int) -> str:
    experts = f", MLP {shape['intermediate_size']}"
    if "num_experts" in shape:
        experts = (f", {shape['num_experts']} experts of {shape['moe_intermediate_size']}, "
                   f"top-{shape['num_experts_per_tok']}")
    return (f"Shape: hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers{experts}, "
            f"{shape['num_attention_heads']} query and {shape['num_key_value_heads']} KV heads, vocabulary {vocab}"
            f"{', tied LM head' if shape.get('tie_word_embeddings') else ''}.")


def summary_table(cases: dict[str, Any]) -> list[str]:
    """| case | the step at each batch | the top batch's three largest parts | its matmuls' shares of the peak |"""
    measured = {key: case for key, case in cases.items() if "served" in case}
    if not measured:
        return []
    batches = list(next(iter(measured.values()))["served"])
    top = batches[-1]
    lines = ["| shape | precision | " + " | ".join(f"c={b} step ms (tokens/s)" for b in batches)
             + f" | c={top}'s largest parts | c={top}'s matmuls, of the peak |",
             "| --- | --- |" + " ---: |" * len(batches) + " --- | --- |"]
    for key, case in measured.items():
        step = case["served"][top]["step"]
        largest = sorted(case["parts"][top].items(), key=lambda item: -item[1])[:3]
        shares = [f"{name} {100 * rate['peak_share']:.0f}%" for name, rate in case["matmuls"][top].items()
                  if rate["peak_share"]]
        lines.append(f"| {key} | {case['precision']} | " + " | ".join(
            f"{case['served'][b]['step']:.1f} ({int(b) * 1000 / case['served'][b]['step']:.0f})" for b in batches)
            + " | " + ", ".join(f"{name} {100 * ms / step:.0f}%" for name, ms in largest) + " | "
            + ", ".join(shares) + " |")
    return [*lines, ""]


def markdown(results: dict[str, Any], command: str) -> str:
    peaks = results["peaks"]
    lines = ["# Where a decode step's time goes, at 1 and 16 rows", "", (__doc__ or "").strip(), "",
             f"ONNX Runtime {results['onnxruntime']}; {results['steps']} timed steps a batch (after "
             f"{results['warm']} untimed), a {PROMPT}-token prompt a row. The core's peaks, one thread: "
             + "; ".join(f"{p} {v['gflops']:.0f} GFLOP/s ({v['kernel']})" for p, v in peaks.items()) + ".", "",
             *summary_table(results["cases"])]
    for key, case in results["cases"].items():
        lines += _case_section(key, case, peaks)
    lines += [f"Reproduce: `{command}` (writes docs/benchmarks/step_breakdown.json and .md; `--quick` runs tiny "
              "models into a scratch folder instead, `--shapes` picks of " + ",".join(CASES) + ").", ""]
    return "\n".join(lines)


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench step_breakdown`."""
    parser = argparse.ArgumentParser(prog="python -m bench step_breakdown")
    parser.add_argument("--shapes", default=None, help=f"of {','.join(CASES)} (default: all; quick: "
                                                       f"{','.join(QUICK_CASES)})")
    parser.add_argument("--steps", type=int, default=None, help=f"timed decode steps a batch (default {STEPS}; "
                                                                f"quick {QUICK_STEPS})")
    args = parser.parse_args(argv)
    chosen = [name for name in (args.shapes or "").split(",") if name] or None
    if unknown := set(chosen or ()) - set(CASES):
        parser.error(f"--shapes: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps: at least 1")
    return {"shapes": chosen, "steps": args.steps}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         shapes: list[str] | None = None, steps: int | None = None) -> Path:
    """`python -m bench step_breakdown [--shapes 100m,1b,...] [--steps N]`: build, then measure every case on one
    pinned core. `repeats` is not used: each part is a mean over the steps."""
    work = work or work_folder("step_breakdown", quick)
    work.mkdir(parents=True, exist_ok=True)
    keys = shapes or list(QUICK_CASES if quick else CASES)
    cases = [tiny(CASES[key]) if quick else CASES[key] for key in keys]
    steps = steps or (QUICK_STEPS if quick else STEPS)
    started = time.perf_counter()
    built = {case.key: _build(case, work) for case in cases}
    results: dict[str, Any] = {"machine": machine(), "onnxruntime": ort.__version__, "steps": steps,
                               "warm": WARM, "prompt": PROMPT, "cases": {}}
    with pinned({min(split_cores()[1])}):
        results["peaks"] = peaks = _peaks(built, quick)
        for case in cases:
            entry = {"title": case.title, "precision": case.precision, "shape": case.shape, "vocab": case.vocab,
                     "gate": built[case.key]["gate"], "default_precision": built[case.key]["default_precision"]}
            bundle = built[case.key]["bundle"]
            if isinstance(bundle, Path):
                print(f"{case.key}: measuring decode steps at c={', '.join(map(str, BATCHES))}", flush=True)
                entry.update(measure(bundle, steps, {p: v["gflops"] for p, v in peaks.items()}))
            else:
                entry["reason"] = bundle
            results["cases"][case.key] = entry
            gc.collect()
    results["seconds"] = time.perf_counter() - started
    named = f" --shapes {','.join(keys)}" if shapes else ""
    command = f"python -m bench step_breakdown{' --quick' if quick else ''}{named}" + \
        (f" --steps {steps}" if steps != (QUICK_STEPS if quick else STEPS) else "")
    text = markdown(results, command)
    path = write("step_breakdown", results, text, out, measures=MEASURES)
    print(text)
    print(f"step_breakdown: {results['seconds']:.0f} s", flush=True)
    return path
