"""mbuild's language-model server against llama.cpp's `llama-server`: same weights, one pinned core, one thread.

Arms, per model shape, in precision pairs: mbuild fp32 / llama.cpp f32, mbuild int8 / q8_0, mbuild int4 / q4_0.
  mbuild     `mbuild serve` of `mbuild package --backend none --gpu cpu --precision P`, MBUILD_THREADS=1
  llama.cpp  `llama-server --threads 1 --threads-batch 1 --parallel 16 --cont-batching`, a slot's context
             equal to mbuild's, on GGUFs converted by its own convert_hf_to_gguf.py (f32) and llama-quantize
Both serve random Llamas with the real Llama SPM tokenizer (32000 tokens): a ~100M one and a Llama-3.2-1B-shaped
one. Every request streams POST /v1/completions with a 64-token text prompt (BOS included, checked against both
servers' usage) and decodes exactly 64 tokens (ignore_eos, min_tokens), with `cache_prompt: false` for
llama.cpp. At concurrency 1 requests go one after another; at c >= 4 one wave of c is sent at once. The two
servers of a pair share one pinned core (one measured at a time), the client has another, the arms alternate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib import llamacpp
from bench.lib.harness import OUT, fp32_peak_gflops, interleave, read_rate_gbs, work_folder, write
from bench.lib.llm_client import run
from bench.lib.llm_models import make_llama_spm, run_flops
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts, greedy, prefix_ttft
from bench.lib.llm_peer_report import plot, report
from bench.lib.llm_peer_shapes import QUICK, SHAPES, Shape
from bench.lib.mbuild import build_or_engine, context_of
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from bench.lib.weight_bytes import gguf_step_bytes, onnx_step_bytes

PAIRS = (("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0"))  # (mbuild precision, llama.cpp GGUF type)
PREFIX_PAIR = ("int8", "fp32")  # shared-prefix TTFT on mbuild's default precision, fp32 if int8 did not build
PREFIX_SEED = 10_000  # prefix texts never collide with the throughput prompts (seeds 0..)


def bodies(prompts: list[str], shape: Shape, model: str | None, bias: dict[str, float]) -> list[dict[str, Any]]:
    """mbuild's bodies (model given), else llama.cpp's: the same plus cache_prompt false."""
    extra = {"model": model} if model else {"cache_prompt": False}
    return [{"prompt": text, "max_tokens": shape.new_tokens, "min_tokens": shape.new_tokens, "ignore_eos": True,
             "temperature": 0.0, "logit_bias": bias, "stream": True, "stream_options": {"include_usage": True},
             **extra} for text in prompts]


Case = tuple[str, Callable[[], float]]


def cases(shape: Shape, urls: dict[str, str], served: str, prompts: list[str], bias: dict[str, float],
          runs: dict[str, list[dict[str, float]]]) -> list[Case]:
    found: list[Case] = []
    for concurrency in shape.concurrency:
        chosen = prompts[:shape.sequential if concurrency == 1 else concurrency]
        for arm, url in urls.items():
            payloads = bodies(chosen, shape, served if arm.startswith("mbuild") else None, bias)
            name = f"{shape.key} {arm} c={concurrency}"
            runs[name] = []
            found.append((name, partial(run, url, payloads, concurrency, len, runs[name], shape.run_seconds)))
    return found


def measure_pair(shape: Shape, pair: tuple[str, str], build: Path | str, gguf: Path | None, context: int,
                 texts: Texts, repeats: int, results: dict[str, Any]) -> None:
    """Both servers of a pair up on one server core, their cases interleaved; the checks on the way. An mbuild
    build that failed leaves llama.cpp measured alone; no GGUF (a quick run without llama.cpp), mbuild alone."""
    client_cpus, servers = split_cores()
    core = {min(servers)}
    ports = {"mbuild": free_port(), "llama": free_port()}
    base = {arm: f"http://{HOST}:{port}" for arm, port in ports.items()}
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    with ExitStack() as stack:
        urls, served = {}, ""
        if isinstance(build, Path):
            ungated = pair[0] in results["ungated"].get(shape.key, {})
            command = mbuild_serve(build, ports["mbuild"]) + (["--allow-failed-gate"] if ungated else [])
            stack.enter_context(server(command, "/v1/health/ready", ports["mbuild"], {"MBUILD_THREADS": "1"},
                                       cpus=core))
            urls[f"mbuild {pair[0]}"], served = f"{base['mbuild']}/v1/completions", served_name(ports["mbuild"])
        if gguf is not None:
            stack.enter_context(server(llamacpp.serve(gguf, ports["llama"], context), "/health", ports["llama"],
                                       cpus=core))
            urls[f"llama.cpp {pair[1]}"] = f"{base['llama']}/v1/completions"
        else:
            base.pop("llama")
        stack.enter_context(pinned(client_cpus))
        runs: dict[str, list[dict[str, float]]] = {}
        found = cases(shape, urls, served, prompts, texts.silent(), runs)
        for name, warm in [case for case in found if case[0].endswith(f" c={shape.warm}")]:  # first-call costs
            print(f"  warm-up {name}: {warm():.1f} tokens/s")
            runs[name].clear()
        interleave(found, min(repeats, shape.max_repeats))
        for name, measured in runs.items():
            _check_prompt_tokens(name, measured)
        results["runs"].update(runs)
        if served:
            _checks(shape, pair, base, served, texts, prompts, results)


def _check_prompt_tokens(name: str, runs: list[dict[str, float]]) -> None:
    """Both servers must see the same 64-token prompts, as their usage reports them."""
    for seen in (r[key] for r in runs for key in ("prompt_tokens_min", "prompt_tokens_max")):
        if seen != PROMPT_TOKENS:
            raise RuntimeError(f"{name}: the server counted {seen:.0f} prompt tokens, expected {PROMPT_TOKENS}")


def _checks(shape: Shape, pair: tuple[str, str], base: dict[str, str], served: str, texts: Texts,
            prompts: list[str], results: dict[str, Any]) -> None:
    if pair[0] == "fp32" and "llama" in base:
        ids = [texts.ids(text) for text in (prompts * 8)[:shape.greedy_prompts]]
        results["greedy"][shape.key] = greedy(base["mbuild"], base["llama"], served, texts, ids, shape.greedy_tokens)
        print(f"  greedy {shape.key}: {results['greedy'][shape.key]['equal']}/{len(ids)} prompts equal")
    if pair[0] == results["prefix_pair"].get(shape.key):
        mine = bodies([""], replace(shape, new_tokens=4), served, texts.silent())[0]
        theirs = {**bodies([""], replace(shape, new_tokens=4), None, texts.silent())[0], "cache_prompt": True}
        args = (texts, shape.prefix_tokens, shape.prefix_samples, PREFIX_SEED)
        results["prefix"][shape.key] = {"pair": list(pair),
                                        "mbuild": prefix_ttft(f"{base['mbuild']}/v1/completions", mine, *args)}
        if "llama" in base:
            results["prefix"][shape.key]["llama.cpp"] = prefix_ttft(f"{base['llama']}/v1/completions", theirs, *args)
        print(f"  shared prefix {shape.key}: " + ", ".join(
            f"{k} cached/uncached {v['ratio']:.2f}" for k, v in results["prefix"][shape.key].items() if k != "pair"))


def measure_shape(shape: Shape, work: Path, repeats: int, results: dict[str, Any], peer: bool) -> None:
    model = make_llama_spm(work / f"llama-{shape.key}-spm", shape.config, llamacpp.SPM_VOCAB)
    files = llamacpp.ggufs(model, work / "gguf") if peer else {}
    builds: dict[str, Path | str] = {}
    for mine, _ in PAIRS:
        builds[mine], gate = build_or_engine(model, work, mine)
        if gate is not None:
            results["ungated"].setdefault(shape.key, {})[mine] = gate
    results["builds"][shape.key] = {p: str(b) if isinstance(b, Path) else f"did not build: {b}"
                                    for p, b in builds.items()}
    results["step_bytes"][shape.key] = {
        **{f"mbuild {p}": onnx_step_bytes(b / "model" / "model.onnx")
           for p, b in builds.items() if isinstance(b, Path)},
        **{f"llama.cpp {kind}": gguf_step_bytes(path) for kind, path in files.items()}}
    results["prefix_pair"][shape.key] = next((p for p in PREFIX_PAIR if isinstance(builds[p], Path)), None)
    context = context_of(builds, model)
    results["context"][shape.key] = context
    config = json.loads((model / "config.json").read_text())
    results["run_flops"][shape.key] = run_flops(config, PROMPT_TOKENS, shape.new_tokens, max(shape.concurrency))
    texts = Texts(model)
    for mine, theirs in PAIRS:
        print(f"{shape.title}: mbuild {mine} against llama.cpp {theirs} (context {context} a sequence)")
        measure_pair(shape, (mine, theirs), builds[mine], files.get(theirs), context, texts, repeats, results)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench llm_peer`; BENCH_PEER_SHAPES=100m,1b picks the shapes. Quick: a tiny Llama, smoke-sized
    runs (bench/lib/llm_peer_shapes.py), mbuild alone where llama.cpp is not built."""
    work = work or work_folder("peer")
    chosen = os.environ.get("BENCH_PEER_SHAPES", "100m,1b").split(",")
    shapes = [QUICK] if quick else [s for s in SHAPES if s.key in chosen]
    print(f"llama.cpp peer benchmark: work in {work}, {repeats} rounds{' (quick)' if quick else ''}")
    llamacpp.ensure_source()  # the Llama SPM vocabulary the models are made with
    peer = llamacpp.peer(quick)
    results: dict[str, Any] = {"runs": {}, "greedy": {}, "prefix": {}, "builds": {}, "context": {},
                               "prefix_pair": {}, "ungated": {}, "step_bytes": {}, "run_flops": {}}
    with pinned({min(split_cores()[1])}):  # the servers' core: the floors every server runs against
        results["read_gbs"], results["peak_gflops"] = read_rate_gbs(), fp32_peak_gflops()
    for shape in shapes:
        measure_shape(shape, work, repeats, results, peer)
    data, markdown = report(results, shapes, PAIRS, repeats, quick, __doc__ or "")
    path = write("llm_peer", data, markdown, out)
    plot(results, shapes, PAIRS, out / "llm_peer.png")
    print(markdown)
    return path
