"""mbuild at a commit against this checkout: llm_peer's int8 arm and load, served by each, rounds paired.

For a change that must not change behaviour (a refactor of the generation scheduler), or must not cost elsewhere:
llm_peer's c=1 and c=16 numbers for its ~100M shape, and each server's memory at ready (its process tree's RSS once
ready, before any request), before and after the change, on one machine in one run.
Model: llm_peer's random ~100M Llama with the real Llama SPM tokenizer (bench/lib/llm_models.py, seeded: the same
weights and tokenizer as llm_peer's), built by each side at int8 as llm_peer's int8 arm builds it (bench/lib/mbuild.py
build_or_engine: `mbuild package --backend none --gpu cpu --precision int8`; where the gate fails on the random
weights, the engine as built with the int8 KV cache its profile plans, served with --allow-failed-gate).
Arms, both up on one pinned core (one measured at a time), MBUILD_THREADS=1, every other setting at its default,
the client on another core:
  before  the tree at --before REF (`git archive`), built and served by its own code (bench/lib/trees.py)
  after   this checkout, built and served the same way
Load (llm_peer's, bench/lib/llm_peer_pairs.py): every request streams POST /v1/completions with a 64-token text prompt
(BOS included, checked against each server's usage) and decodes exactly 64 tokens (ignore_eos, min_tokens, greedy);
at c=1 4 requests go one after another, at c=16 one wave of 16 is sent at once. A warm-up wave for each arm (c=16;
the 1b shape: llm_peer's c=4 and one request at c=1), then the rounds: before c=1, after c=1, before c=16, after c=16,
and again. Each round's after / before total tokens/s
pairs the arms in time; the page shows their median and range.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from bench.lib import llamacpp, trees
from bench.lib.harness import OUT, Series, machine, work_folder, write
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import rounds
from bench.lib.llm_peer_report import METRICS, arm_series
from bench.lib.llm_peer_shapes import QUICK, SHAPES, Shape, make_model
from bench.lib.mbuild import ROOT, source_hash
from bench.lib.rss import tree_memory
from bench.lib.servers import pinned, split_cores

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "mbuild at a commit against this checkout: llm_peer's load, paired"

PRECISION = "int8"  # llm_peer's int8 arm
CONCURRENCY = (1, 16)
QUICK_BEFORE = "HEAD"  # a quick run without --before: the last commit against the working tree
SHOWN = (("total_tok_s", "total tokens/s"), ("ttft_p50_ms", "TTFT p50"), ("tpot_p50_ms", "TPOT p50"))


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench code_pair`."""
    keys = [shape.key for shape in SHAPES]
    parser = argparse.ArgumentParser(prog="python -m bench code_pair")
    parser.add_argument("--before", metavar="REF",
                        help=f"the commit measured as before: required (a quick run without it: {QUICK_BEFORE})")
    parser.add_argument("--shapes", default=keys[0],
                        help=f"llm_peer's shapes, comma-separated, of {','.join(keys)} (default: %(default)s)")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    if not shapes or set(shapes) - set(keys):
        parser.error(f"--shapes: pick from {','.join(keys)}, not {args.shapes}")
    return {"before": args.before, "shapes": shapes}


def measure_shape(shape: Shape, work: Path, sides: dict[str, tuple[Path, Path]], repeats: int,
                  results: dict[str, Any]) -> None:
    """Both sides' builds of `shape` up on one server core, their cases interleaved (llm_peer's rounds)."""
    model = make_model(shape, work)
    builds: dict[str, tuple[Path, str | None]] = {}
    for arm, (tree, folder) in sides.items():
        print(f"{shape.title}: {arm}'s {PRECISION} build, by its own code", flush=True)
        built, gate = trees.build_or_engine(tree, model, folder, PRECISION)
        if not isinstance(built, Path):
            raise RuntimeError(f"{arm}'s {PRECISION} build of {shape.key} did not build: {built}")
        builds[arm] = built, gate
    results["builds"][shape.key] = {arm: str(built) for arm, (built, _) in builds.items()}
    results["ungated"][shape.key] = {arm: gate for arm, (_, gate) in builds.items() if gate}
    texts = Texts(model)
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    client_cpus, servers = split_cores()
    runs: dict[str, list[dict[str, float]]] = {}
    with ExitStack() as stack:
        urls: dict[str, str] = {}
        names: dict[str, str | None] = {}
        for arm, (tree, _) in sides.items():
            bundle, gate = builds[arm]
            started: list[int] = []
            urls[arm], names[arm] = trees.serve(stack, tree, bundle, {"MBUILD_THREADS": "1"}, {min(servers)},
                                                *(["--allow-failed-gate"] if gate else []), started=started)
            # its process tree's RSS once ready, before any request: what a replica holds idle
            results["ready_mb"].setdefault(shape.key, {})[arm] = tree_memory(psutil.Process(started[0]))[0] / 1e6
        stack.enter_context(pinned(client_cpus))
        rounds(shape, urls, names, prompts, texts, repeats, runs)
    results["runs"].update(runs)


def paired(results: dict[str, Any], key: str, concurrency: int, metric: str) -> Series:
    """Each round's after / before of `metric`: the rounds ran one after the other, so drift hits both alike."""
    before, after = (results["runs"][f"{key} {arm} c={concurrency}"] for arm in ("before", "after"))
    return Series([a[metric] / b[metric] for a, b in zip(after, before, strict=True)])


def shape_table(results: dict[str, Any], shape: Shape, data: dict[str, Any]) -> list[str]:
    rows = ["| c | arm | total tokens/s | TTFT p50 ms | TPOT p50 ms |", "| ---: | --- | ---: | ---: | ---: |"]
    verdict = []
    for concurrency in shape.concurrency:
        for arm in ("before", "after"):
            name = f"{shape.key} {arm} c={concurrency}"
            found = arm_series(results, name)
            assert found is not None, name
            data["results"][name] = {m: {"median": s.median, "values": s.values} for m, s in found.items()}
            tok = found["total_tok_s"]
            rows.append(f"| {concurrency} | {arm} | {tok.median:.1f} ({tok.spread()}) | "
                        f"{found['ttft_p50_ms'].median:.1f} | {found['tpot_p50_ms'].median:.2f} |")
        ratios = {metric: paired(results, shape.key, concurrency, metric) for metric, _ in SHOWN}
        data["ratios"][f"{shape.key} c={concurrency}"] = {m: {"median": s.median, "values": s.values}
                                                          for m, s in ratios.items()}
        cells = [f"{label} {ratios[metric].median:.3f}x ({ratios[metric].spread(3)})" for metric, label in SHOWN]
        rates = ratios["total_tok_s"].values
        holds = "holds 1.000" if min(rates) <= 1 <= max(rates) else "does not hold 1.000"
        verdict.append(f"- c={concurrency}, after / before, median of the rounds' ratios (their range): "
                       f"{', '.join(cells)}; the tokens/s range {holds}")
    held = results["ready_mb"].get(shape.key, {})
    if {"before", "after"} <= set(held):
        verdict.append(f"- memory at ready (the server's process tree's RSS, before any request): before "
                       f"{held['before']:.0f} MB, after {held['after']:.0f} MB ({held['after'] / held['before']:.3f}x)")
    return [*verdict, "", *rows, ""]


def report(results: dict[str, Any], shapes: list[Shape], quick: bool) -> tuple[dict[str, Any], str]:
    data: dict[str, Any] = {key: results[key] for key in ("before", "after", "repeats", "builds", "ungated",
                                                          "machine", "runs", "ready_mb")}
    data.update(scenario="code_pair", quick=quick, precision=PRECISION, metrics=list(METRICS), results={},
                ratios={}, prompt_tokens=PROMPT_TOKENS,
                shapes={s.key: {"title": s.title, "config": s.config, "concurrency": list(s.concurrency),
                                "sequential": s.sequential, "new_tokens": s.new_tokens} for s in shapes})
    title = "# mbuild at a commit against this checkout: llm_peer's load, paired"
    run = results["machine"]
    lines = [title + (" (quick: not a result)" if quick else ""), "",
             f"Before: {results['before']}; after: this checkout ({run['commit']}, {results['after']}). "
             f"{PRECISION} builds, {results['repeats']} round(s) after a warm-up wave each. Machine: {run['cpu']}, "
             f"{run['cores']} cores.", ""]
    for shape in shapes:
        lines += [f"## {shape.title}", "", *shape_table(results, shape, data)]
        lines += [f"- {arm}: its engine failed the gate on this random model ({gate}); served as built with "
                  "`mbuild serve --allow-failed-gate`" for arm, gate in results["ungated"][shape.key].items()]
        lines.append("")
    lines += ["How it was measured (bench/scenarios/code_pair.py):", "", "```", (__doc__ or "").strip(), "```", ""]
    return data, "\n".join(lines)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None, before: str | None = None,
         shapes: list[str] | None = None) -> Path:
    """`python -m bench code_pair --before REF [--shapes 100m,1b]`. Quick: the tiny Llama, smoke-sized runs, one
    round, HEAD as before unless --before names another."""
    if before is None and not quick:
        raise SystemExit("python -m bench code_pair: --before REF is required (the commit measured as before)")
    before = before or QUICK_BEFORE
    work = work or work_folder("code_pair", quick)
    work.mkdir(parents=True, exist_ok=True)
    chosen = [QUICK] if quick else [replace(s, concurrency=CONCURRENCY, max_repeats=Shape.max_repeats)
                                    for s in SHAPES if s.key in (shapes or [SHAPES[0].key])]
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    old, commit = trees.tree_at(before, work)
    sides = {"before": (old, work / f"builds-{commit[:12]}"), "after": (ROOT, work / "builds-checkout")}
    print(f"code pair: before {before} ({commit[:12]}) against this checkout, work in {work}, {repeats} rounds"
          f"{' (quick)' if quick else ''}", flush=True)
    results: dict[str, Any] = {"runs": {}, "builds": {}, "ungated": {}, "ready_mb": {}, "repeats": repeats,
                               "before": f"{before} ({commit[:12]})", "after": f"src-{source_hash()}",
                               "machine": machine()}
    for shape in chosen:
        measure_shape(shape, work, sides, repeats, results)
    data, markdown = report(results, chosen, quick)
    path = write("code_pair", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path

