"""The llama.cpp comparison's report: docs/benchmarks/llm_peer.{json,md,png} from bench/scenarios/llm_peer.py's runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.lib.harness import Series, machine
from bench.lib.llamacpp import VERSION
from bench.lib.llm_peer_checks import PROMPT_TOKENS
from bench.lib.llm_peer_shapes import KEYS, Shape
from bench.lib.llm_peer_targets import Target, medians, target_lines
from bench.lib.plots import save_peer_plot
from bench.lib.servers import split_cores

METRICS = ("total_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")
Pairs = tuple[tuple[str, str], ...]


def arm_series(results: dict[str, Any], name: str) -> dict[str, Series] | None:
    rounds = results["runs"].get(name)
    return {m: Series([r[m] for r in rounds]) for m in METRICS} if rounds else None


def _row(concurrency: int, pair: str, arm: str, series: dict[str, Series] | None, ratio: float | None) -> str:
    if series is None:
        return f"| {concurrency} | {pair} | {arm} | did not build | - | - | - | - | - |"
    tok = series["total_tok_s"]
    cells = [f"{tok.median:.1f} ({tok.spread()})", *(f"{series[m].median:.0f}" for m in METRICS[1:3]),
             *(f"{series[m].median:.1f}" for m in METRICS[3:])]
    return f"| {concurrency} | {pair} | {arm} | {' | '.join(cells)} | {'-' if ratio is None else f'{ratio:.2f}x'} |"


def pair_table(results: dict[str, Any], shape: Shape, pairs: Pairs, data: dict[str, Any]) -> list[str]:
    rows = ["| c | pair | server | total tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | "
            "mbuild / llama.cpp tokens/s |", "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for concurrency in shape.concurrency:
        for mine, theirs in pairs:
            ours = arm_series(results, f"{shape.key} mbuild {mine} c={concurrency}")
            peer = arm_series(results, f"{shape.key} llama.cpp {theirs} c={concurrency}")
            ratio = ours["total_tok_s"].median / peer["total_tok_s"].median if ours and peer else None
            label = f"{mine} / {theirs}"
            for arm, series in ((f"mbuild {mine}", ours), (f"llama.cpp {theirs}", peer)):
                name = f"{shape.key} {arm} c={concurrency}"
                if series:
                    data["results"][name] = {m: {"median": s.median, "values": s.values} for m, s in series.items()}
                rows.append(_row(concurrency, label, arm, series, ratio if arm.startswith("llama") else None))
            if ratio is not None:
                data["results"][f"{shape.key} llama.cpp {theirs} c={concurrency}"]["mbuild_ratio"] = ratio
    return rows


WHOLE = " whole (from the files each server loads)"


def streaming(results: dict[str, Any], shape: Shape, pairs: Pairs, concurrency: int = 1,
              sizes: dict[str, int] | None = None, reads: str = WHOLE) -> list[str]:
    """At one stream each step reads every weight once: bytes a step reads / TPOT p50 is the rate a server
    streams its weights, against the rate one core reads at all. `sizes`: the bytes a step reads at
    `concurrency`, by arm (default: results["step_bytes"], at c=1); `reads` says which bytes they are."""
    rate, sizes = results["read_gbs"], results["step_bytes"][shape.key] if sizes is None else sizes
    lines = [f"Weights streamed at c={concurrency}: the bytes a decode step reads{reads} over "
             f"TPOT p50; one core reads at most {rate:.1f} GB/s here (best of 5 numpy maxima over 1 GiB on the "
             "servers' core).", "",
             f"| pair | server | MB a step reads | GB/s at c={concurrency} | share of the core's rate |",
             "| --- | --- | ---: | ---: | ---: |"]
    for mine, theirs in pairs:
        for arm in (f"mbuild {mine}", f"llama.cpp {theirs}"):
            measured = arm_series(results, f"{shape.key} {arm} c={concurrency}")
            if measured is None or arm not in sizes:
                continue
            streamed = sizes[arm] / measured["tpot_p50_ms"].median / 1e6
            lines.append(f"| {mine} / {theirs} | {arm} | {sizes[arm] / 1e6:.0f} | {streamed:.1f} | "
                         f"{streamed / rate:.0%} |")
    return [*lines, ""]


def _compute(results: dict[str, Any], shape: Shape, pairs: Pairs, wanted: float) -> list[str]:
    """At the top concurrency an fp32 wave is compute-bound: its FLOPs over the core's fp32 peak is the least time
    any fp32 engine takes, which caps how far ahead of llama.cpp's f32 any engine can be; `wanted`: the fp32
    target's ratio."""
    top, (mine, theirs) = max(shape.concurrency), next(pair for pair in pairs if pair[0] == "fp32")
    flops, peak = results["run_flops"][shape.key], results["peak_gflops"]
    tokens = top * shape.new_tokens
    best = tokens * peak * 1e9 / flops  # tokens/s of a server doing nothing but matmuls at the peak
    lines = [f"Compute at c={top}, {mine} / {theirs}: the wave's {top} requests are {flops / 1e12:.2f} TFLOP of "
             f"matmuls (prompt and decode positions through every layer, attention over the positions before, the "
             f"LM head once per output token). One core does at most {peak:.1f} GFLOP/s of fp32 matmul here (the "
             "best of torch's and ONNX Runtime's on square and 512-row Llama-3.2-1B MLP matmuls, on the servers' "
             f"core), so no fp32 engine serves the wave faster than {best:.1f} tokens/s.", "",
             "| server | tokens/s | GFLOP/s | share of the core's peak |", "| --- | ---: | ---: | ---: |"]
    rates = {}
    for arm in (f"mbuild {mine}", f"llama.cpp {theirs}"):
        series = arm_series(results, f"{shape.key} {arm} c={top}")
        if series is not None:
            rates[arm] = rate = series["total_tok_s"].median
            lines.append(f"| {arm} | {rate:.1f} | {rate / best * peak:.1f} | {rate / best:.0%} |")
    lines.append(f"| any fp32 engine at the peak | {best:.1f} | {peak:.1f} | 100% |")
    if f"llama.cpp {theirs}" in rates:
        need = wanted * rates[f"llama.cpp {theirs}"]
        lines += ["", f"{wanted:.1f}x llama.cpp {theirs} is {need:.1f} tokens/s: {need / best:.0%} of the core's "
                  f"peak, end to end; at most {best / rates[f'llama.cpp {theirs}']:.2f}x llama.cpp is reachable at "
                  "all."]
    return [*lines, ""]


def checks(results: dict[str, Any], shape: Shape) -> list[str]:
    lines = []
    greedy = results["greedy"].get(shape.key)
    if greedy:
        agreeing = ", ".join(str(r["agreeing_tokens"]) for r in greedy["rows"])
        lines += [f"Greedy agreement, mbuild fp32 against llama.cpp f32: **{greedy['equal']}/{greedy['prompts']} "
                  f"prompts equal** over {greedy['new_tokens']} new tokens (tokens agreeing before the first "
                  f"difference, per prompt: {agreeing}; mbuild dropped the opening space in "
                  f"{greedy['leading_space_dropped']}).", ""]
    prefix = results["prefix"].get(shape.key)
    if prefix:
        mine, theirs = prefix["pair"]
        lines += [f"Shared-prefix TTFT ({shape.prefix_tokens}-token prefix + 16 new tokens, mbuild {mine} / "
                  f"llama.cpp {theirs}, {shape.prefix_samples} sample(s) each, median):", "",
                  "| server | uncached TTFT ms | cached TTFT ms | cached / uncached |", "| --- | ---: | ---: | ---: |"]
        for server in (name for name in ("mbuild", "llama.cpp") if name in prefix):  # quick: maybe mbuild alone
            one = prefix[server]
            lines.append(f"| {server} | {Series(one['uncached_ms']).median:.0f} | {Series(one['cached_ms']).median:.0f}"
                         f" | {one['ratio']:.2f} |")
        lines.append("")
    return lines


def build_notes(results: dict[str, Any], shape: Shape) -> list[str]:
    """A line for each mbuild build that failed, or whose engine failed its gate and is served as built."""
    failed = [f"- mbuild {p}: {b}" for p, b in results["builds"][shape.key].items() if b.startswith("did not")]
    return failed + [f"- mbuild {p}: its engine failed the gate on this random model ({why}); served as built with "
                     "`mbuild serve --allow-failed-gate`" for p, why in results["ungated"].get(shape.key, {}).items()]


def _targets(results: dict[str, Any], shape: Shape, pairs: Pairs, targets: tuple[Target, ...],
             data: dict[str, Any]) -> list[str]:
    top = max(shape.concurrency)
    arms = [arm for mine, theirs in pairs for arm in (f"mbuild {mine}", f"llama.cpp {theirs}")]
    series = {arm: arm_series(results, f"{shape.key} {arm} c={top}") for arm in arms}
    return target_lines(targets, top, medians(series, "total_tok_s"), medians(series, "ttft_p50_ms"),
                        data["targets"].setdefault(shape.key, {}))


def _shape_section(results: dict[str, Any], shape: Shape, pairs: Pairs, targets: tuple[Target, ...], repeats: int,
                   quick: bool, data: dict[str, Any]) -> list[str]:
    failed = build_notes(results, shape)
    fp32 = next((t.wanted for t in targets if t.mine == "mbuild fp32"), 1.0)
    rounds = min(repeats, shape.max_repeats)
    data["shapes"][shape.key] = {"title": shape.title, "config": shape.config, "concurrency": shape.concurrency,
                                 "sequential": shape.sequential, "new_tokens": shape.new_tokens, "rounds": rounds,
                                 "context": results["context"][shape.key], "builds": results["builds"][shape.key]}
    return [f"## {shape.title}", "",
            f"{shape.new_tokens} new tokens a request; {shape.sequential} request(s) one after another at c=1; "
            f"{rounds} round(s); context {results['context'][shape.key]} tokens a sequence on both servers.", "",
            *([] if quick else _targets(results, shape, pairs, targets, data)),
            *pair_table(results, shape, pairs, data), "", *([*failed, ""] if failed else []),
            *streaming(results, shape, pairs, reads=_reads(shape)), *_compute(results, shape, pairs, fp32),
            *checks(results, shape)]


def _reads(shape: Shape) -> str:
    """What a step reads at c=1: every weight, or of a mixture of experts' the k experts the token is routed to."""
    experts = shape.config.get("num_experts")
    if not experts:
        return WHOLE
    routed = shape.config["num_experts_per_tok"]
    return (f" (from the files each server loads: every weight but the experts, and of each layer's {experts} "
            f"experts the {routed} the token is routed to)")


NOTES = [
    "Metrics, as vLLM's benchmark_serving defines them, per run (median of the rounds; min-max for tokens/s):",
    "",
    "- TTFT: time from sending a request to its first streamed chunk with non-empty text; p99 over a run's "
    "requests is in effect their maximum.",
    "- TPOT: (end-to-end latency - TTFT) / (output tokens - 1) per request, p50 and p99 over the run.",
    "- Output tokens: both servers' `usage.completion_tokens` (`stream_options.include_usage`); every request is "
    "checked to produce exactly its new tokens, and both servers' `usage.prompt_tokens` to be 64.",
    "- Total tokens/s: all output tokens of the run / wall time from the first send to the last stream's end.",
    "- Greedy agreement: 8 token-id prompts (the 64-token prompts' ids), temperature 0, no logit bias, sent to "
    "mbuild's /v1/completions and llama-server's /completion (`return_tokens`). mbuild returns text only, so a "
    "prompt is equal when llama.cpp's tokens, decoded by the model's tokenizer, give mbuild's text (a dropped "
    "opening space, which mbuild did before it decoded after the prompt's last tokens, is reported, not counted "
    "as a difference). llama.cpp keeps its KV cache in f16 (its default), mbuild in fp32, and random "
    "weights give near-tied logits.",
    "- Both servers get the same `logit_bias`: -100 on the 260 tokens that stream no text alone (control tokens, "
    "the 256 byte pieces, the bare word-start piece). A random model strings lone UTF-8 bytes together, which "
    "llama.cpp holds back until they form a character (sometimes never), so TTFT would not mean the same on both.",
    "- Shared prefix: `cache_prompt: true` for llama.cpp here only; the cached request follows one warm request "
    "with the same prefix and another tail, the uncached one uses a prefix never sent before.",
    "- The 1B shape is cut down to fit an hour on one core: one request at c=1 (four for the other shapes), a "
    "warm-up wave at c=4 (c=16 for the others), one round whatever --repeats says, one shared-prefix sample per "
    "server (three for the others).",
]


def report(results: dict[str, Any], shapes: list[Shape], pairs: Pairs, targets: tuple[Target, ...], repeats: int,
           mode: str, intro: str) -> tuple[dict[str, Any], str]:
    """The page; `mode`: "" for a result, "quick" or "smoke" for a check that it runs (the targets left out of a
    quick one)."""
    quick = mode == "quick"
    client, servers = sorted(split_cores()[0]), [min(split_cores()[1])]
    data: dict[str, Any] = {"scenario": "L2 language model served against llama.cpp", "machine": machine(),
                            "repeats": repeats, "quick": quick, "mode": mode, "targets": {},
                            "cores": {"client": client, "servers": servers},
                            "prompt_tokens": PROMPT_TOKENS, "shapes": {}, "results": {},
                            "greedy": results["greedy"], "prefix": results["prefix"],
                            "read_gbs": results["read_gbs"], "step_bytes": results["step_bytes"],
                            "peak_gflops": results["peak_gflops"], "run_flops": results["run_flops"]}
    sections = [line for shape in shapes
                for line in _shape_section(results, shape, pairs, targets, repeats, quick, data)]
    header = "# Language model served: mbuild against llama.cpp's llama-server"
    m = data["machine"]
    keys = ",".join(shape.key for shape in shapes)
    command = ("" if quick or keys == "100m,1b" else f"BENCH_PEER_SHAPES={keys} ") + (
        f"python -m bench llm_peer {'--quick' if quick else f'--repeats {repeats}'}") + (
        " --smoke" if mode == "smoke" else "")
    markdown = "\n".join([
        header + (" (quick smoke run)" if quick else " (smoke: not a result)" if mode else ""), "", intro.strip(), "",
        f"Machine: {m['cores']} cores ({m['cpu']}), Python {m['python']}, {m['date']}; both servers of a pair on "
        f"core {servers} with one thread, the client on core {client}; llama.cpp from llama-cpp-python "
        f"{VERSION}'s vendored tree.", "",
        *sections, "![Total output tokens/s against concurrency](llm_peer.png)", "", *NOTES, "",
        f"Reproduce: `{command}` (writes docs/benchmarks/llm_peer.json, .md and .png; `--quick` runs a smoke-sized "
        f"version into a scratch folder instead; `BENCH_PEER_SHAPES`, comma-separated, of {','.join(KEYS)}, picks the "
        "shapes, 100m,1b by default).", ""])
    return data, markdown


def plot(results: dict[str, Any], shapes: list[Shape], pairs: Pairs, path: Path) -> Path:
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for shape in shapes:
        arms = [f"mbuild {p[0]}" for p in pairs] + [f"llama.cpp {p[1]}" for p in pairs]
        panels[shape.title] = {arm: [(c, s["total_tok_s"].median) for c in shape.concurrency
                                     if (s := arm_series(results, f"{shape.key} {arm} c={c}"))] for arm in arms}
        panels[shape.title] = {arm: rows for arm, rows in panels[shape.title].items() if rows}
    return save_peer_plot(panels, path)
