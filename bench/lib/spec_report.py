"""The speculative decoding benchmark's report: docs/benchmarks/speculative.{json,md,png} (n-gram lookup) or
speculative_draft.{json,md,png} (a draft model) from bench/scenarios/speculative.py's runs. Every speedup is a ratio
of total output tokens/s in the same run (the median of the rounds' paired ratios), shown beside the acceptance
(accepted / drafted tokens, summed over the rounds) the speculating arm reported, and beside the speedup that the
target's own verify-row costs allow at that acceptance (bench/lib/verify_cost.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.lib.harness import Series, machine, median_interval
from bench.lib.llamacpp import VERSION
from bench.lib.plots import save_speedup_plot
from bench.lib.servers import split_cores
from bench.lib.spec_arms import Plan
from bench.lib.spec_prompts import DRAFTS, LOOKUP_MAX, LOOKUP_MIN, NEW_TOKENS, PROMPT_TOKENS
from bench.lib.verify_cost import bound
from runtimes.generation.speculative import DEFAULT_DRAFTS

METRICS = ("total_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms")
# done-when: at c=1 where mbuild's acceptance >= ACCEPTED, mbuild on / off and / llama.cpp on at least these (on: the
# method measured, n-gram or a draft model); at the top concurrency, mbuild on / off at least TOP_FLOOR on every kind
ACCEPTED, C1_SPEEDUP, C1_PEER, TOP_FLOOR = 0.7, 1.8, 1.2, 0.95


def _series(results: dict[str, Any], name: str) -> dict[str, Series] | None:
    rounds = results["runs"].get(name)
    return {m: Series([r[m] for r in rounds]) for m in METRICS} if rounds else None


def _acceptance(results: dict[str, Any], name: str) -> tuple[float | None, float]:
    """(accepted / drafted, drafted per output token) over the case's rounds; None where nothing was drafted."""
    rounds = results["runs"].get(name) or []
    drafted, accepted = sum(r["draft_n"] for r in rounds), sum(r["draft_n_accepted"] for r in rounds)
    tokens = sum(r["tokens"] for r in rounds)
    return (accepted / drafted if drafted else None), (drafted / tokens if tokens else 0.0)


def _pairs(results: dict[str, Any], ours: str, theirs: str) -> list[float] | None:
    """Each run's ratio to the other arm's run beside it (both arms ran the same number of runs), else None."""
    a, b = _series(results, ours), _series(results, theirs)
    if not a or not b or len(a["total_tok_s"].values) != len(b["total_tok_s"].values):
        return None
    return [x / y for x, y in zip(a["total_tok_s"].values, b["total_tok_s"].values, strict=True)]


def _ratio(results: dict[str, Any], ours: str, theirs: str) -> float | None:
    """The median of the paired ratios: a case's arms run back to back, so the drift between rounds (seen here: one
    arm's median 30% apart from round to round) cancels in each pair; the ratio of the medians where unpaired."""
    if (pairs := _pairs(results, ours, theirs)) is not None:
        return statistics.median(pairs)
    a, b = _series(results, ours), _series(results, theirs)
    return a["total_tok_s"].median / b["total_tok_s"].median if a and b else None


def speedups(results: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    """One row per (kind, c): each server's on / off and its acceptance, and mbuild on / llama.cpp on."""
    rows = []
    for kind in plan.kinds:
        for c in plan.concurrency:
            row: dict[str, Any] = {"kind": kind.key, "concurrency": c}
            for server in ("mbuild", "llama.cpp"):
                on = f"{kind.key} {server} {plan.method} c={c}"
                acceptance, per_token = _acceptance(results, on)
                pairs = _pairs(results, on, f"{kind.key} {server} off c={c}") or []
                row[server] = {"speedup": _ratio(results, on, f"{kind.key} {server} off c={c}"),
                               "interval": median_interval(pairs), "pairs": len(pairs),
                               "acceptance": acceptance, "drafted_per_token": per_token}
            row["mbuild_over_llama"] = _ratio(results, f"{kind.key} mbuild {plan.method} c={c}",
                                              f"{kind.key} llama.cpp {plan.method} c={c}")
            row["mbuild_over_llama_off"] = _ratio(results, f"{kind.key} mbuild off c={c}",
                                                  f"{kind.key} llama.cpp off c={c}")
            rows.append(row)
    return rows


def _x(value: float | None, digits: int = 2, unit: str = "x") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def summary_table(rows: list[dict[str, Any]], lookup: dict[str, float | None], on: str) -> list[str]:
    lines = [f"| prompt | c | replayed acceptance | mbuild acceptance | mbuild {on} / off | llama.cpp acceptance | "
             f"llama.cpp {on} / off | mbuild {on} / llama.cpp {on} | mbuild off / llama.cpp off |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        mine, theirs = row["mbuild"], row["llama.cpp"]
        cells = [_x(lookup.get(row["kind"]), unit=""), _x(mine["acceptance"], unit=""), _x(mine["speedup"]),
                 _x(theirs["acceptance"], unit=""), _x(theirs["speedup"]), _x(row["mbuild_over_llama"]),
                 _x(row["mbuild_over_llama_off"])]
        lines.append(f"| {row['kind']} | {row['concurrency']} | {' | '.join(cells)} |")
    return [*lines, ""]


def kind_table(results: dict[str, Any], plan: Plan, key: str, data: dict[str, Any]) -> list[str]:
    lines = ["| c | server | total tokens/s | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms | acceptance | drafted a token |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in plan.concurrency:
        for arm in (*plan.arms("mbuild"), *plan.arms("llama.cpp")):
            name = f"{key} {arm} c={c}"
            series = _series(results, name)
            if series is None:
                continue
            acceptance, per_token = _acceptance(results, name)
            data["results"][name] = {**{m: {"median": s.median, "values": s.values} for m, s in series.items()},
                                     "acceptance": acceptance, "drafted_per_token": per_token}
            tok = series["total_tok_s"]
            lines.append(f"| {c} | {arm} | {tok.median:.1f} ({tok.spread()}) | {series['tpot_p50_ms'].median:.2f} | "
                         f"{series['tpot_p99_ms'].median:.2f} | {series['ttft_p50_ms'].median:.0f} | "
                         f"{_x(acceptance, unit='')} | {per_token:.2f} |")
    return [*lines, ""]


def targets(rows: list[dict[str, Any]], plan: Plan, ceilings: dict[str, float] | None = None
            ) -> tuple[dict[str, Any], list[str]]:
    """The done-when targets against what was measured, beside what the engine's step costs allow (where measured);
    a target with no row to judge says so."""
    top = max(plan.concurrency)
    high = [r for r in rows if r["concurrency"] == 1 and (r["mbuild"]["acceptance"] or 0) >= ACCEPTED]
    found: dict[str, Any] = {"c1": [{"kind": r["kind"], "acceptance": r["mbuild"]["acceptance"],
                                     "speedup": r["mbuild"]["speedup"], "over_llama": r["mbuild_over_llama"],
                                     "interval": r["mbuild"]["interval"], "pairs": r["mbuild"]["pairs"]}
                                    for r in high],
                             "top": [{"kind": r["kind"], "speedup": r["mbuild"]["speedup"],
                                      "interval": r["mbuild"]["interval"], "pairs": r["mbuild"]["pairs"]}
                                     for r in rows if r["concurrency"] == top]}

    def verdict(value: float | None, floor: float) -> str:
        return "not measured" if value is None else f"{value:.2f}x ({'met' if value >= floor else '**missed**'})"

    def judged(row: dict[str, Any], floor: float) -> str:
        """Against the floor with the median's 95% interval over the pairs: met where all of it is at or above,
        missed where all of it is below, else the run cannot tell."""
        if row["interval"] is None:
            return verdict(row["speedup"], floor)
        low, high = row["interval"]
        word = "met" if low >= floor else "**missed**" if high < floor else "not told apart from the line"
        return f"{row['speedup']:.2f}x (95% interval {low:.2f}-{high:.2f} over {row['pairs']} pairs: {word})"

    on = plan.method
    lines = [f"- c=1 where mbuild's acceptance is at least {ACCEPTED}: mbuild {on} / mbuild off >= {C1_SPEEDUP}x and "
             f"mbuild {on} / llama.cpp {on} >= {C1_PEER}x."]
    def allowed(kind: str) -> str:
        if not ceilings or kind not in ceilings:
            return ""
        return f" (its replayed drafts at this engine's step costs give {ceilings[kind]:.2f}x, overhead left out)"

    lines += [f"  - {r['kind']} (acceptance {r['acceptance']:.2f}): {judged(r, C1_SPEEDUP)} against off"
              f"{allowed(r['kind'])}; {verdict(r['over_llama'], C1_PEER)} against llama.cpp {on}"
              for r in found["c1"]] or [
        f"  - no prompt kind reached acceptance {ACCEPTED} at c=1: not judged"]
    lines.append(f"- c={top}: speculation costs at most {1 - TOP_FLOOR:.0%} (mbuild {on} / off >= {TOP_FLOOR}x) on "
                 "every prompt kind: " + "; ".join(f"{r['kind']} {judged(r, TOP_FLOOR)}" for r in found["top"]) + ".")
    return found, [*lines, ""]


def _checks(results: dict[str, Any]) -> list[str]:
    model, lines = results["model"], []
    margin = model["margin"]
    lines.append(f"The analytic model: over {margin['tokens']:.0f} sampled tokens of the cycle the right logit is "
                 f"{margin['right_logit_mean']:.1f} on average, the others' spread {margin['other_logit_std']:.2f}, "
                 f"the smallest lead {margin['min_lead_sd']:.1f} standard deviations, argmax right on "
                 f"{margin['argmax_right']:.0%}; transformers' greedy decode (fp32, the whole model) of a repeat "
                 f"prompt follows f for {model['transformers_follows']}/{NEW_TOKENS} tokens.")
    if results["follows"]:
        kinds = list(next(iter(results["follows"].values())))
        lines += ["", "Tokens of the expected continuation each server's greedy answer gives (of "
                  f"{NEW_TOKENS}):", "", "| server | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        lines += [f"| {arm} | " + " | ".join(str(found[k]) for k in kinds) + " |"
                  for arm, found in results["follows"].items()]
    if metrics := results.get("metrics"):
        counted, reported = metrics["counters"], metrics["timings"]
        lines += ["", f"mbuild's /metrics over the rounds: {counted['vllm:spec_decode_num_drafts_total']:.0f} verify "
                  f"rows, {counted['vllm:spec_decode_num_draft_tokens_total']:.0f} draft tokens, "
                  f"{counted['vllm:spec_decode_num_accepted_tokens_total']:.0f} accepted; the responses' timings "
                  f"summed: {reported['draft_n']} drafted, {reported['draft_n_accepted']} accepted."]
    return [*lines, ""]


def verify_section(found: dict[str, Any] | None, lookup: dict[str, float | None]) -> list[str]:
    """What a verify row of each width cost mbuild's engine, and the c=1 speedup those costs allow."""
    if not found:
        return []
    costs = {int(w): ms for w, ms in found["ms"].items()}
    lines = ["## What a verify row costs", "",
             "mbuild's engine (the served bundle, in the benchmark's process, one thread on the servers' core), one "
             f"slot holding {found['context']} positions, a row of the last token and w - 1 drafts with logits at "
             "every position, the median step:", "",
             "| width | ms | x one token |", "| ---: | ---: | ---: |"]
    lines += [f"| {w} | {ms:.2f} | {ms / costs[1]:.2f}x |" for w, ms in costs.items()]
    rate = found["extra_gmacs"]
    lines += ["", f"Each token past the first adds {found['extra_ms_per_token']:.2f} ms, "
              f"{found['extra_share']:.0%} of a one-token step: its {found['macs_per_token'] / 1e6:.1f} M "
              "multiply-adds over the weights" + (f" at {rate:.0f} G a second" if rate else "") + ", where the "
              "one-token step is bound by reading the weights. So a verify row's tokens are not free, and what "
              "speculation can give at c=1 is bounded by these costs as well as by acceptance."]
    if ceilings := found.get("ceilings"):
        lines += ["", f"Each prompt kind's replayed steps (up to {DRAFTS} drafts a step, as replayed acceptance counts "
                  "them) priced at these costs, against one-token steps: the decode-only speedup at c=1 with no "
                  "per-step overhead and no prefill (both lower a server's):", "",
                  "| prompt | replayed acceptance | speedup |", "| --- | ---: | ---: |"]
        lines += [f"| {kind} | {_x(lookup.get(kind), unit='')} | {value:.2f}x |" for kind, value in ceilings.items()]
    lines += ["", "Where each draft is accepted independently with probability a (while those before it were), k "
              "drafts give (1 - a^(k+1)) / (1 - a) tokens a row; at these costs the best k gives:", "",
              "| per-draft acceptance | speedup | drafts |", "| ---: | ---: | ---: |"]
    for a in (0.5, ACCEPTED, 0.75, 0.9):
        most, drafts = bound(a, costs)
        lines.append(f"| {a:.2f} | {most:.2f}x | {drafts} |")
    return [*lines, ""]


NOTES = [  # {pairs}: the waves each of mbuild's arms ran a round
    "Notes:",
    "- Speedup = the median over the rounds of the ratio of two arms' total output tokens/s (all output tokens over "
    "the run's wall time), the arms of a case run back to back within a round; mbuild's two arms run "
    "{pairs} waves each a round (at c=1 a wave is the requests one after another), alternating which goes first "
    "(off on, on off, ...), and its on / off is the median over all those adjacent pairs (this host drifts more "
    "between waves a few seconds apart than the targets' lines), while mbuild / llama.cpp is the ratio of the "
    "medians; TPOT = (latency - TTFT) / (tokens - "
    "1); acceptance = accepted / drafted tokens as each response's `timings` reports them (llama.cpp's fields, "
    "which mbuild also sends), summed over the rounds; "
    "\"drafted a token\" = draft tokens verified per output token, which shows how often a server speculated at all.",
    "- \"replayed acceptance\" is what drafting 4 tokens at every step would see on the expected continuation "
    "(n-gram: mbuild's own propose(); a draft model: its known successor function), greedy acceptance: the ceiling. "
    "mbuild drafts fewer as a row's acceptance falls and speculates only when its cost model says a verify row "
    "pays, so it may draft less, and at higher concurrency mostly not at all; llama.cpp drafts whenever lookup "
    "finds a match or its draft model runs.",
    "- Prompts are token ids (`prompt: [ids]`), fresh ones each round and wave and the same for every arm of a wave, "
    "so no prefix is ever cached on either server; llama.cpp's requests also carry `cache_prompt: false`.",
]


TITLES = {"ngram": "n-gram prompt lookup", "draft": "a draft model"}


def report(results: dict[str, Any], plan: Plan, quick: bool, intro: str, command: str,
           page: str = "speculative") -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    client, servers = sorted(split_cores()[0]), [min(split_cores()[1])]
    rows = speedups(results, plan)
    costs = results.get("verify_cost")
    found, target_lines = targets(rows, plan, costs.get("ceilings") if costs else None)
    data: dict[str, Any] = {"scenario": f"speculative decoding by {TITLES[plan.method]}, against llama.cpp",
                            "machine": machine(), "repeats": plan.repeats, "quick": quick, "command": command,
                            "cores": {"client": client, "servers": servers}, "prompt_tokens": PROMPT_TOKENS,
                            "new_tokens": NEW_TOKENS, "drafts": DEFAULT_DRAFTS[plan.method],
                            "lookup": [LOOKUP_MIN, LOOKUP_MAX],
                            "model": results["model"], "context": results["context"], "build": results["build"],
                            "follows": results["follows"], "metrics": results.get("metrics"),
                            "replayed_acceptance": results["lookup"], "speedups": rows, "targets": found,
                            "verify_cost": costs,
                            "results": {}}
    sections = []
    for kind in plan.kinds:
        replayed = results["lookup"].get(kind.key)
        sections += [f"### {kind.title}", "",
                     f"Replayed acceptance (up to {DRAFTS} drafts a step, mbuild's rule): {_x(replayed, unit='')}.",
                     "", *kind_table(results, plan, kind.key, data)]
    m = data["machine"]
    markdown = "\n".join([
        f"# Speculative decoding by {TITLES[plan.method]}: mbuild against llama.cpp's llama-server"
        + (" (quick smoke run)" if quick else ""), "", intro.strip(), "",
        f"Machine: {m['cores']} cores ({m['cpu']}), Python {m['python']}, {m['date']}; every server on core {servers} "
        f"with one thread, the client on core {client}; llama.cpp from llama-cpp-python {VERSION}'s vendored tree; "
        f"{plan.repeats} round(s); {plan.sequential} request(s) one after another at c=1; context "
        f"{results['context']} tokens a sequence on both servers; {results['build']}.", "",
        *_checks(results), "## Targets", "", *target_lines, "## Speedups beside acceptance", "",
        *summary_table(rows, results["lookup"], plan.method), f"![Speedup against acceptance]({page}.png)", "",
        *verify_section(costs, results["lookup"]),
        "## Each prompt kind", "", *sections, *(line.format(pairs=plan.pairs) for line in NOTES), "",
        f"Reproduce: `{command}` (writes docs/benchmarks/{page}.json, .md and .png; `--quick` runs a tiny model "
        "of the same construction into a scratch folder instead).", ""])
    return data, markdown, rows


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    points = [(server, row["concurrency"], row["kind"], row[server]["acceptance"], row[server]["speedup"])
              for row in rows for server in ("mbuild", "llama.cpp") if row[server]["speedup"] is not None]
    return save_speedup_plot(points, path)
