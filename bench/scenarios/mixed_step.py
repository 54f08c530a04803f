"""Running streams while long prompts arrive: mbuild's engine step (one plan per step) against the scheduler before it.

Model: the ~100M random Llama of the LLM benchmarks on its word-level tokenizer (bench/lib/llm_models.py; every
"w<id>" one token, so prompt lengths are exact), each side's default build (`mbuild package --gpu cpu`, no
precision named: what a user gets; on this random model int8's gate fails and both fall back to fp32, as a user's
build would; the report says which precision each served).
Arms, all up on one pinned core (one measured at a time), MBUILD_THREADS=1, every other setting at its default
(MBUILD_PREFILL_CHUNK 512) but where named, rounds interleaved after a warm-up round each:
  after   this checkout: `plan_step()` plans each step's decode rows and prompt chunks under one token budget
  after, chunk 128  the same build and code with MBUILD_PREFILL_CHUNK=128: a step carries less prompt
  before  the tree at BEFORE (default: the last commit before the engine step), built and served by its own code
          (`git archive`, so its engine format is its own): each iteration prefilled up to 512 prompt tokens, then
          ran one decode step for the running rows
Load (bench/lib/mixed_load.py), one round: 4 streams of a 64-token prompt decode 1024 tokens each; once every one
has its first token and a second of quiet decoding has passed, 2 prompts of 1920 tokens arrive 1 s apart, each
asking for one token. The streams' gaps between successive tokens are their TPOT as a user sees it; those that
end between the first long prompt's arrival and the last one's answer are "during", those before it "quiet".
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import make_llama_words, measured_shape
from bench.lib.mbuild import ROOT, source_hash
from bench.lib.mixed_load import Load, Round, measure, summary
from bench.lib.servers import pinned, split_cores
from bench.lib.trees import build, serve, tree_at

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "running streams' token gaps while long prompts arrive"

BEFORE = "cecfc19"  # the parent of "engine: one step of works" (51eab35): the scheduler that prefilled apart
SMALL_CHUNK = 128  # the third arm's MBUILD_PREFILL_CHUNK
QUICK_LOAD = Load(streams=2, new_tokens=1024, long_prompts=1, long_tokens=256, spacing=0.3)


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench mixed_step`."""
    parser = argparse.ArgumentParser(prog="python -m bench mixed_step")
    parser.add_argument("--before", default=BEFORE, help="the commit measured as before (default: %(default)s)")
    return {"before": parser.parse_args(argv).before}


def _report(results: dict[str, Any], load: Load, command: str, quick: bool) -> tuple[dict[str, Any], str]:
    arms = results["arms"]
    rows = ["| arm | gap p50 during ms | gap p99 during ms | gap max ms | gaps during | quiet gap p50 ms | "
            "quiet gap p99 ms | long prompt TTFT p50 ms | stream tokens/s in the window |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, found in arms.items():
        rows.append(f"| {name} ({results['precision'][name]}) | {found['gap_p50_ms']:.1f} | "
                    f"{found['gap_p99_ms']:.1f} | {found['gap_max_ms']:.1f} | "
                    f"{found['gaps_during']} | {found['quiet_p50_ms']:.1f} | {found['quiet_p99_ms']:.1f} | "
                    f"{found['long_ttft_p50_ms']:.0f} | {found['stream_tokens_in_window_per_s']:.1f} |")
    after, before = arms.get("after"), arms.get("before")
    verdict = []
    if after and before:
        ratio = after["gap_p99_ms"] / before["gap_p99_ms"]
        results["p99_after_over_before"] = ratio
        verdict = [f"TPOT p99 of the running streams while the prompts arrive, after / before: **{ratio:.2f}x** "
                   f"({'lower' if ratio < 1 else 'not lower'} with the engine step); the long prompts' TTFT "
                   f"{after['long_ttft_p50_ms'] / before['long_ttft_p50_ms']:.2f}x."]
        small = arms.get(f"after, chunk {SMALL_CHUNK}")
        if small:
            verdict += [f"With MBUILD_PREFILL_CHUNK={SMALL_CHUNK}, after / before: TPOT p99 "
                            f"{small['gap_p99_ms'] / before['gap_p99_ms']:.2f}x, p50 "
                            f"{small['gap_p50_ms'] / before['gap_p50_ms']:.2f}x, the long prompts' TTFT "
                            f"{small['long_ttft_p50_ms'] / before['long_ttft_p50_ms']:.2f}x: the budget trades one "
                            "against the other."]
        verdict.append("")
    title = "# Running streams while long prompts arrive: the engine step against the scheduler before it"
    lines = [title + (" (quick: not a result)" if quick else ""), "", f"Command: `{command}`", "",
             f"Before: {results['before']}; after: this checkout ({results['after']}). {results['rounds']} round(s) "
             f"after a warm-up round each; {load.streams} streams x {load.new_tokens} tokens, {load.long_prompts} "
             f"prompts of {load.long_tokens} tokens {load.spacing:g} s apart. Machine: {results['machine']['cpu']}, "
             f"{results['machine']['cores']} cores.", "",
             *verdict, *rows, "", "How it was measured (bench/scenarios/mixed_step.py):", "", "```",
             (__doc__ or "").strip(), "```", ""]
    return results, "\n".join(lines)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         before: str = BEFORE) -> Path:
    """`python -m bench mixed_step [--before REF]`. Quick: the tiny Llama and a small load, one round."""
    work = work or work_folder("mixed_step", quick)
    work.mkdir(parents=True, exist_ok=True)
    key, shape = measured_shape(quick)
    load = QUICK_LOAD if quick else Load()
    model = make_llama_words(work / f"llama-{key}-words", shape)
    old, commit = tree_at(before, work)
    trees = {"before": (old, commit[:12]), "after": (ROOT, f"src-{source_hash()}")}
    built = {arm: build(tree, stamp, model, work) for arm, (tree, stamp) in trees.items()}
    # this checkout again with a smaller chunk: what MBUILD_PREFILL_CHUNK trades between the streams and the prompts
    arms = {**{arm: (tree, built[arm], {}) for arm, (tree, _) in trees.items()},
            f"after, chunk {SMALL_CHUNK}": (ROOT, built["after"], {"MBUILD_PREFILL_CHUNK": str(SMALL_CHUNK)})}
    client_cpus, servers = split_cores()
    rounds = 1 if quick else repeats
    found: dict[str, list[Round]] = {arm: [] for arm in arms}
    with ExitStack() as stack:
        urls, names = {}, {}
        for arm, (tree, bundle, settings) in arms.items():
            urls[arm], names[arm] = serve(stack, tree, bundle, {"MBUILD_THREADS": "1", **settings}, {min(servers)})
        stack.enter_context(pinned(client_cpus))
        for arm in arms:  # first-call costs
            measure(urls[arm], names[arm], load, seed=99)
        for round_ in range(rounds):
            for arm in arms:
                found[arm].append(measure(urls[arm], names[arm], load, seed=round_))
                print(f"  round {round_ + 1}/{rounds} {arm}: {summary(found[arm][-1:])}", flush=True)
    results: dict[str, Any] = {"arms": {arm: summary(r) for arm, r in found.items()}, "rounds": rounds,
                               "precision": {arm: json.loads((b / "model" / "engine.json").read_text())["precision"]
                                             for arm, (_, b, _) in arms.items()},
                               "before": f"{before} ({commit[:12]})", "after": trees["after"][1],
                               "load": load.__dict__, "machine": machine()}
    shown = f"python -m bench mixed_step {'--quick' if quick else f'--repeats {repeats}'}" + (
        "" if before == BEFORE else f" --before {before}")
    data, markdown = _report(results, load, shown, quick)
    path = write("mixed_step", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
