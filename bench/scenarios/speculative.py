"""Speculative decoding by n-gram prompt lookup or a draft model, mbuild against llama.cpp's, on a known model.

The method: n-gram prompt lookup, or a draft model with `--draft-error E` (below).

Model: a ~100M Llama (llm_peer's shape: hidden 640, 12 layers, 10 query and 5 KV heads, MLP 1728, untied LM head)
on the Llama SPM vocabulary (32000 tokens), bf16 safetensors, built analytically (bench/lib/spec_model.py): random
weights but every o_proj and down_proj zero, and LM head row f(t) = embedding row t x 2 for a permutation f of the
vocabulary that is one long cycle through the tokens that stream text, so the greedy next token after t is f(t)
(checked: logit margin, transformers' own greedy decode, each server's answers). Attention and the MLP run at full
cost, so a step costs what a real model of the shape costs.
Prompts (bench/lib/spec_prompts.py), token ids, 62 a prompt: repeat (a 60-token chain t0, f(t0), ... then t0: the
continuation repeats the prompt), edit2/3/5/10 (every J-th chain token replaced: drafts reaching a replaced token
are wrong; J=2 leaves no bigram to look up, J=3 makes every draft wrong, 5 and 10 give ~0.6 and ~0.9 at mbuild's
k, 0.25 and ~0.9 at 8 drafts every time), open
(distinct tokens: nothing to draft). Every request streams POST /v1/completions, greedy, exactly 64 new tokens
(ignore_eos, min_tokens); a wave is 4 requests one after another at c=1, c requests at once at c=4 and 16;
llama.cpp's arms run one wave each a round, mbuild's off and on arms 4 each (--pairs), alternating; the same
prompts for every arm of a wave, fresh ones each wave.
Arms, one build or GGUF each, all four servers up on one pinned core, measured one at a time, rounds interleaved:
  mbuild     `mbuild serve` of `mbuild package --backend none --gpu cpu` at its default CPU precision (int8),
             MBUILD_THREADS=1, MBUILD_SPECULATIVE=off and =ngram (its default drafts a row, 8 for lookup and 4
             for a draft model, fewer as a row's acceptance falls; MBUILD_PROMPT_LOOKUP_MIN=2, _MAX=4)
  llama.cpp  `llama-server --threads 1 --threads-batch 1 --parallel 16 --cont-batching`, a slot's context equal to
             mbuild's, on q8_0 (its convert_hf_to_gguf.py --outtype bf16, then llama-quantize), without and with
             `--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 8` (prompt lookup of
             the last 2 tokens, 8 drafts; mbuild tries 4 down to 2, the same match on these prompts)
With --draft-error E the speculating arms draft with a model instead, on open prompts (where lookup has nothing):
the draft is the same construction at LLAMA_TINY's shape (hidden 128, 2 layers), wrong after a share E of tokens
(bench/lib/spec_model.py), so its acceptance is about 1 - E. mbuild builds it with `mbuild package TARGET --draft
DRAFT` and serves with MBUILD_SPECULATIVE=draft (off: =off, the same build); llama.cpp serves its q8_0 GGUF beside
the target's with `--spec-type draft-simple -md DRAFT --spec-draft-n-max 4 --spec-draft-n-min 0
--spec-draft-p-min 0 -td 1 -tbd 1`. Written to docs/benchmarks/speculative_draft.*.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import llamacpp, verify_cost
from bench.lib.harness import OUT, work_folder, write
from bench.lib.llm_models import LLAMA_100M, LLAMA_TINY
from bench.lib.llm_peer_checks import Texts
from bench.lib.mbuild import build_or_engine, context_of, plan
from bench.lib.servers import split_cores
from bench.lib.spec_arms import PAIRS, Peers, Plan, measure
from bench.lib.spec_model import SCALE, greedy_follows, load_order, load_successor, make_agreeing_llama, margin
from bench.lib.spec_prompts import Kind, chained, kinds, lookup, prompts, replay, widths
from bench.lib.spec_report import plot, report
from runtimes.generation.speculative import DEFAULT_DRAFTS

# the one line of its pages' headers and of the README's index, n-gram and draft: bench/lib/page_header.py
MEASURES = ("n-gram speculative decoding, against llama.cpp", "draft-model speculative decoding, against llama.cpp")

EDITS = (2, 3, 5, 10)  # edit prompts: every J-th chain token replaced
GGUF = "q8_0"  # llama.cpp's type beside mbuild's int8, made from the bf16 GGUF its converter writes
REPLAYS = 16  # prompts a kind's replayed acceptance averages over


def _replayed(chosen: tuple[Kind, ...], order: np.ndarray, draft: Path | None) -> dict[str, float | None]:
    found: dict[str, float | None] = {}
    for kind in chosen:
        pairs = prompts(kind, order, REPLAYS, 7)
        counts = ([replay(ids, expected, chained(load_successor(draft)), DEFAULT_DRAFTS["draft"])
                   for ids, expected in pairs] if draft
                  else [lookup(ids, expected) for ids, expected in pairs])
        drafted = sum(c["drafted"] for c in counts)
        found[kind.key] = sum(c["accepted"] for c in counts) / drafted if drafted else None
    return found


def _ceilings(chosen: tuple[Kind, ...], order: np.ndarray, costs: dict[int, float]) -> dict[str, float]:
    """Per prompt kind, the c=1 decode-only speedup prompt lookup (up to DRAFTS a step) gives at the engine's measured
    step costs: the replayed steps' widths priced by verify_cost, against one-token steps; no overhead counted."""
    found = {}
    for kind in chosen:
        pairs = prompts(kind, order, REPLAYS, 7)
        found[kind.key] = statistics.mean(len(expected) * costs[1] / sum(costs[w] for w in widths(ids, expected))
                                          for ids, expected in pairs)
    return found


def _build_note(precision: str, build: Path | str, gate: str | None, gguf: Path | None) -> str:
    if isinstance(build, str):
        mine = f"mbuild {precision} (its default here) did not build: {build}"
    else:
        served = f"served as built with `--allow-failed-gate` (its gate on this model: {gate})"
        mine = f"mbuild {precision} (its default here), " + (served if gate else "its gate passed")
    return mine + (f"; llama.cpp {GGUF}" if gguf else "; llama.cpp not measured")


def _default_precision(model: Path) -> str:
    """The precision `mbuild package --gpu cpu` picks here (int8 on a VNNI CPU), as `mbuild plan` says."""
    profile = plan(model).get("profile") or {}
    return str((profile.get("content") or {}).get("precision") or "int8")


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench speculative`."""
    parser = argparse.ArgumentParser(prog="python -m bench speculative")
    parser.add_argument("--edits", default=",".join(map(str, EDITS)),
                        help="edit prompts' spacings J, every J-th chain token replaced (default: %(default)s)")
    parser.add_argument("--draft-error", type=float, default=None,
                        help="measure a draft model instead of n-gram lookup, wrong after this share of tokens")
    parser.add_argument("--pairs", type=int, default=PAIRS,
                        help="waves each of mbuild's arms runs a round, alternating (default: %(default)s)")
    options = parser.parse_args(argv)
    edits = tuple(int(j) for j in options.edits.split(",") if j)
    if any(j < 2 for j in edits):
        parser.error("--edits: every spacing must be at least 2")
    if options.draft_error is not None and not 0 <= options.draft_error < 1:
        parser.error("--draft-error: a share, at least 0 and below 1")
    if not 1 <= options.pairs <= 20:
        parser.error("--pairs: from 1 to 20 waves a round")
    return {"edits": edits, "draft_error": options.draft_error, "pairs": options.pairs}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         edits: tuple[int, ...] = EDITS, draft_error: float | None = None, pairs: int = PAIRS) -> Path:
    """`python -m bench speculative [--edits 2,3,5,10] [--draft-error E] [--pairs N]`. Quick: a tiny model of the same
    construction (hidden 128, 2 layers), one round, llama.cpp's arms left out where it is not built."""
    work = work or work_folder("speculative", quick)
    work.mkdir(parents=True, exist_ok=True)
    key, shape = ("tiny", LLAMA_TINY) if quick else ("100m", LLAMA_100M)
    print(f"speculative decoding against llama.cpp: work in {work}, {1 if quick else repeats} round(s)"
          f"{' (quick)' if quick else ''}", flush=True)
    llamacpp.ensure_source()  # the Llama SPM vocabulary the model is made with
    peer = llamacpp.peer(quick)
    model = make_agreeing_llama(work / f"llama-{key}-agreeing", shape, llamacpp.SPM_VOCAB)
    order = load_order(model)
    draft = None if draft_error is None else make_agreeing_llama(
        work / f"llama-draft-e{round(draft_error * 100)}", LLAMA_TINY, llamacpp.SPM_VOCAB, error=draft_error)
    chosen = kinds(edits) if draft is None else (Kind("open", lookup_hits=False),)
    run_plan = Plan(chosen, "ngram" if draft is None else "draft", sequential=2 if quick else 4,
                    repeats=1 if quick else repeats, pairs=2 if quick else pairs)
    ids, expected = prompts(chosen[0], order, 1, 0)[0]
    results: dict[str, Any] = {"runs": {}, "follows": {}, "lookup": _replayed(chosen, order, draft), "model": {
        "shape": shape, "scale": SCALE, "margin": margin(model),
        "transformers_follows": greedy_follows(model, ids, expected)}}
    print(f"  model: {results['model']['margin']}; transformers follows f for "
          f"{results['model']['transformers_follows']}/{len(expected)} tokens", flush=True)
    precision = _default_precision(model)
    build, gate = build_or_engine(model, work, precision, draft=draft)
    gguf = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf", (GGUF,), "bf16")[GGUF] if peer else None
    draft_gguf = (llamacpp.ggufs(llamacpp.spm_ready(draft), work / "gguf-draft", (GGUF,), "bf16")[GGUF]
                  if peer and draft else None)
    results["context"] = context_of({precision: build}, model)
    results["build"] = _build_note(precision, build, gate, gguf)
    if draft is not None:
        results["draft"] = {"error": draft_error, "shape": LLAMA_TINY}
    if isinstance(build, Path):  # before the servers are up, on the core they will take
        results["verify_cost"] = verify_cost.summary(build, model, DEFAULT_DRAFTS[run_plan.method] + 1,
                                                     {min(split_cores()[1])})
        if draft is None:
            results["verify_cost"]["ceilings"] = _ceilings(chosen, order, results["verify_cost"]["ms"])
    measure(run_plan, Peers(build, gguf, results["context"], gate is not None, draft_gguf), Texts(model), order,
            results)
    command = f"python -m bench speculative {'--quick' if quick else f'--repeats {repeats}'}" + (
        "" if edits == EDITS or draft else f" --edits {','.join(map(str, edits))}") + (
        f" --draft-error {draft_error}" if draft else "") + ("" if pairs == PAIRS or quick else f" --pairs {pairs}")
    page = "speculative" if draft is None else "speculative_draft"
    data, markdown, rows = report(results, run_plan, quick, __doc__ or "", command, page)
    path = write(page, data, markdown, out, measures=MEASURES[draft is not None])
    plot(rows, out / f"{page}.png")
    print(markdown)
    for row in rows:
        if row["concurrency"] == 1:
            print(f"acceptance {row['kind']} c=1: mbuild {row['mbuild']['acceptance']}, "
                  f"llama.cpp {row['llama.cpp']['acceptance']} (replayed {results['lookup'][row['kind']]})")
    return path
