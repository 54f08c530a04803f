"""The families comparison's report: docs/benchmarks/llm_families.{json,md,png} from bench/scenarios/llm_families.py's
runs, in the llama.cpp comparison's tables (bench/lib/llm_peer_report.py) plus the targets and the builds' memory."""

from __future__ import annotations

from typing import Any

from bench.lib.harness import machine
from bench.lib.llamacpp import VERSION
from bench.lib.llm_peer_checks import PROMPT_TOKENS
from bench.lib.llm_peer_report import Pairs, arm_series, build_notes, checks, pair_table, streaming
from bench.lib.llm_peer_shapes import Shape
from bench.lib.servers import split_cores

GIB = 2**30
Targets = dict[str, dict[int, float]]  # shape key -> concurrency -> least mbuild / llama.cpp tokens/s wanted


def ratio(results: dict[str, Any], shape: Shape, pair: tuple[str, str], concurrency: int) -> float | None:
    """mbuild's median total tokens/s over llama.cpp's for a pair at a concurrency; None where one is missing."""
    ours = arm_series(results, f"{shape.key} mbuild {pair[0]} c={concurrency}")
    theirs = arm_series(results, f"{shape.key} llama.cpp {pair[1]} c={concurrency}")
    return ours["total_tok_s"].median / theirs["total_tok_s"].median if ours and theirs else None


def _default_pair(results: dict[str, Any], shape: Shape, pairs: Pairs) -> tuple[str, str] | None:
    default = results["default"][shape.key]["precision"]
    return next((pair for pair in pairs if pair[0] == default), None)


def _targets(results: dict[str, Any], shape: Shape, pairs: Pairs, targets: Targets,
             data: dict[str, Any]) -> list[str]:
    """The default precision's ratios, against the targets where the shape has any."""
    pair = _default_pair(results, shape, pairs)
    if pair is None:
        return [f"mbuild's default precision here ({results['default'][shape.key]['precision']}) is not one of the "
                "pairs measured.", ""]
    wanted = targets.get(shape.key, {})
    found = {c: ratio(results, shape, pair, c) for c in sorted({*shape.concurrency, *wanted})}
    data["targets"][shape.key] = {"pair": list(pair), "wanted": wanted, "measured": found}
    parts = []
    for concurrency, measured in found.items():
        shown = "not measured" if measured is None else f"{measured:.2f}x"
        if concurrency in wanted:
            verdict = "" if measured is None else " (met)" if measured >= wanted[concurrency] else " (**behind**)"
            shown += f" against >= {wanted[concurrency]:.1f}x{verdict}"
        parts.append(f"c={concurrency} {shown}")
    return [f"mbuild {pair[0]} (its default here) / llama.cpp {pair[1]}, total tokens/s: {'; '.join(parts)}.", ""]


def _experts_note(config: dict[str, Any], tokens: int, share: float) -> str:
    return (f" with {tokens} token(s) a step (every weight but the experts, and of each layer's "
            f"{config['num_experts']} experts the {share:.0%} that {tokens} token(s), each routed to "
            f"{config['num_experts_per_tok']}, are expected to reach when the router picks alike, as a random one "
            "does)")


def _moe_streaming(results: dict[str, Any], shape: Shape, pairs: Pairs) -> list[str]:
    config, top = shape.config, max(shape.concurrency)
    shares = results["experts_read"][shape.key]
    lines = streaming(results, shape, pairs, 1, results["step_bytes"][shape.key], _experts_note(config, 1, shares["1"]))
    wave = streaming(results, shape, pairs, top, results["step_bytes_top"][shape.key],
                     _experts_note(config, top, shares[str(top)]))
    return [*lines, *wave[:-1], "", f"At c={top} TPOT also holds the prompts' prefill that runs between decode steps, "
            "so these rates are lower bounds of what a decode step streams.", ""]


def _memory(results: dict[str, Any], shape: Shape, pairs: Pairs, data: dict[str, Any]) -> list[str]:
    """Each build step's peak memory: mbuild's package beside llama.cpp's converter and quantizer."""
    runs = results["build_memory"][shape.key]
    data["build_memory"][shape.key] = runs
    rows = ["| build | peak RSS GiB | of it anonymous GiB | stage at the peak | wall s | output GiB |",
            "| --- | ---: | ---: | --- | ---: | ---: |"]
    for name, run in runs.items():
        if run is None:
            continue
        status = "" if not run["rc"] else f" (exit {run['rc']}{', gate failed' if name.startswith('mbuild') else ''})"
        output = f"{run['output_bytes'] / GIB:.2f}" if "output_bytes" in run else "-"
        rows.append(f"| {name}{status} | {run['peak_rss'] / GIB:.2f} | {run['peak_anon'] / GIB:.2f} | "
                    f"{run.get('peak_stage') or '-'} | {run['wall_s']:.0f} | {output} |")
    checkpoint = results["checkpoint_bytes"][shape.key] / GIB
    lines = [f"Build memory, each build run once as a subprocess (checkpoint {checkpoint:.2f} GiB of bf16 "
             "safetensors): the peak RSS of its process tree, sampled every 0.1 s.", "", *rows, ""]
    for mine, theirs in pairs:
        ours, path = runs.get(f"mbuild {mine}"), _gguf_path(theirs, results["gguf_source"])
        if ours and all(runs.get(step) for step in path):
            peak = max(runs[step]["peak_rss"] for step in path)
            lines.append(f"- mbuild {mine} peaked at {ours['peak_rss'] / GIB:.2f} GiB, llama.cpp's path to {theirs} "
                         f"({' then '.join(f'`{step}`' for step in path)}: the larger peak) at {peak / GIB:.2f} GiB: "
                         f"{ours['peak_rss'] / peak:.2f}x.")
    return [*lines, ""]


def _gguf_path(kind: str, source: str) -> list[str]:
    """The steps (as bench/lib/llamacpp.py's ggufs records them) that make a GGUF of `kind`."""
    if kind in ("f32", "bf16"):
        return [f"convert_hf_to_gguf.py --outtype {kind}"]
    return [f"convert_hf_to_gguf.py --outtype {source}", f"llama-quantize {kind}"]


def _steps(results: dict[str, Any], shape: Shape) -> list[str]:
    """The default pair's decode steps, engines alone: where mbuild's time goes beside llama.cpp's whole step."""
    found = results["steps"].get(shape.key)
    if not found:
        return []
    mine, theirs = found["pair"]
    rows = [f"| c | mbuild {mine} step ms | its largest ops, ms a step | llama.cpp {theirs} step ms | mbuild / "
            "llama.cpp step time | served TPOT p50, mbuild / llama.cpp |",
            "| ---: | ---: | --- | ---: | ---: | ---: |"]
    for batch, profile in found["mbuild"].items():
        ops = ", ".join(f"{op} {ms:.2f}" for op, ms in list(profile["ops_ms"].items())[:4])
        peer = found.get("llama.cpp", {}).get(batch)
        ours = arm_series(results, f"{shape.key} mbuild {mine} c={batch}")
        served = arm_series(results, f"{shape.key} llama.cpp {theirs} c={batch}")
        tpot = f"{ours['tpot_p50_ms'].median / served['tpot_p50_ms'].median:.2f}" if ours and served else "-"
        step = profile["step_ms"]
        theirs_ms, ratio_ms = ("-", "-") if peer is None else (f"{peer:.2f}", f"{step / peer:.2f}")
        rows.append(f"| {batch} | {step:.2f} | {ops} | {theirs_ms} | {ratio_ms} | {tpot} |")
    return [f"Decode steps of the default pair's engines alone, no server, on the servers' core with one thread "
            f"({PROMPT_TOKENS} tokens in each of c sequences, then steps of all c): mbuild's DecoderEngine under ONNX "
            "Runtime's profiler (time by op type; the LM head apart), llama.cpp's `llama-batched-bench` (whole "
            "steps). A step faster than llama.cpp's beside a served TPOT slower than llama.cpp's puts the "
            "difference in the server (scheduling, sampling, streaming); a slower step, in the ops listed.", "",
            *rows, ""]


def _section(results: dict[str, Any], shape: Shape, pairs: Pairs, repeats: int, targets: Targets,
             data: dict[str, Any]) -> list[str]:
    rounds = min(repeats, shape.max_repeats)
    params = results["params"][shape.key]
    data["shapes"][shape.key] = {"title": shape.title, "config": shape.config, "concurrency": shape.concurrency,
                                 "sequential": shape.sequential, "new_tokens": shape.new_tokens, "rounds": rounds,
                                 "context": results["context"][shape.key], "builds": results["builds"][shape.key],
                                 "params": params, "default": results["default"][shape.key]}
    default = results["default"][shape.key]
    failed = build_notes(results, shape)
    moe = "num_experts" in shape.config
    return [f"## {shape.title}", "",
            f"{params['total'] / 1e9:.2f}B parameters, {params['active'] / 1e9:.2f}B of them a token's; "
            f"{shape.new_tokens} new tokens a request; {shape.sequential} request(s) one after another at c=1; "
            f"{rounds} round(s); context {results['context'][shape.key]} tokens a sequence on both servers. "
            f"mbuild's default profile for it here: {default['profile']} (`mbuild plan`).", "",
            *pair_table(results, shape, pairs, data), "", *([*failed, ""] if failed else []),
            *_targets(results, shape, pairs, targets, data),
            *(_moe_streaming(results, shape, pairs) if moe else streaming(results, shape, pairs)),
            *_steps(results, shape), *checks(results, shape), *_memory(results, shape, pairs, data)]


NOTES = [
    "Metrics as in [llm_peer.md](llm_peer.md) (vLLM's benchmark_serving definitions): TTFT to the first streamed "
    "text, TPOT = (latency - TTFT) / (tokens - 1), total tokens/s = all output tokens / the run's wall time; every "
    f"request is checked to stream exactly its new tokens and both servers' usage to count {PROMPT_TOKENS} prompt "
    "tokens (Qwen's tokenizer adds no BOS).",
    "- Both servers get the same `logit_bias`: -100 on the tokens that stream no text alone (special tokens, and "
    "the byte-level pieces that end inside a UTF-8 character, which a random model strings together and llama.cpp "
    "holds back), so TTFT means the same on both.",
    "- An engine that fails mbuild's gate on these random models (near-tied logits) is served as built with "
    "`--allow-failed-gate`, as in llm_peer, and listed under its table.",
    "- A random router picks experts near-uniformly; a trained one is skewed, so a real model's c=16 steps reach "
    "fewer distinct experts than here, on both servers alike.",
]


def report(results: dict[str, Any], shapes: list[Shape], pairs: Pairs, repeats: int, quick: bool, intro: str,
           targets: Targets, command: str) -> tuple[dict[str, Any], str]:
    client, servers = sorted(split_cores()[0]), [min(split_cores()[1])]
    data: dict[str, Any] = {"scenario": "decoder families served against llama.cpp", "machine": machine(),
                            "repeats": repeats, "quick": quick, "cores": {"client": client, "servers": servers},
                            "prompt_tokens": PROMPT_TOKENS, "shapes": {}, "results": {}, "targets": {},
                            "build_memory": {}, "greedy": results["greedy"], "read_gbs": results["read_gbs"],
                            "step_bytes": results["step_bytes"], "step_bytes_top": results["step_bytes_top"],
                            "steps": results["steps"], "gguf_source": results["gguf_source"],
                            "command": command}
    sections = [line for shape in shapes for line in _section(results, shape, pairs, repeats, targets, data)]
    m = data["machine"]
    markdown = "\n".join([
        "# Decoder families served: mbuild against llama.cpp's llama-server" + (" (quick smoke run)" if quick else ""),
        "", intro.strip(), "",
        f"Machine: {m['cores']} cores ({m['cpu']}), Python {m['python']}, {m['date']}; both servers of a pair on "
        f"core {servers} with one thread, the client on core {client}; llama.cpp from llama-cpp-python "
        f"{VERSION}'s vendored tree.", "",
        *sections, "![Total output tokens/s against concurrency](llm_families.png)", "", *NOTES, "",
        f"Reproduce: `{command}` (writes docs/benchmarks/llm_families.json, .md and .png; `--quick` runs tiny "
        "models of both families into a scratch folder instead, with an fp32 / f32 pair for greedy agreement; "
        "`--families moe` or `dense` picks the models).", ""])
    return data, markdown
