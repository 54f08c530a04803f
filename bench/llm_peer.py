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
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench import llamacpp
from bench.builds import build_mbuild, source_hash
from bench.harness import OUT, fp32_peak_gflops, interleave, read_rate_gbs, write
from bench.llm_client import run
from bench.llm_models import LLAMA_1B, LLAMA_100M, make_llama_spm, run_flops
from bench.llm_peer_checks import PROMPT_TOKENS, Texts, greedy, prefix_ttft
from bench.llm_peer_report import plot, report
from bench.servers import HOST, free_port, mbuild_serve, pinned, server, split_cores
from bench.weight_bytes import gguf_step_bytes, onnx_step_bytes

PAIRS = (("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0"))  # (mbuild precision, llama.cpp GGUF type)
PREFIX_PAIR = ("int8", "fp32")  # shared-prefix TTFT on mbuild's default precision, fp32 if int8 did not build
PREFIX_SEED = 10_000  # prefix texts never collide with the throughput prompts (seeds 0..)


@dataclass(frozen=True)
class Shape:
    key: str
    title: str
    config: dict[str, Any]
    concurrency: tuple[int, ...] = (1, 4, 16)
    sequential: int = 4  # requests at concurrency 1
    warm: int = 16  # the concurrency of the warm-up wave each arm gets before the rounds
    new_tokens: int = 64
    max_repeats: int = 99
    greedy_prompts: int = 8
    greedy_tokens: int = 16
    prefix_tokens: int = 1000
    prefix_samples: int = 3
    run_seconds: float = 300.0


SHAPES = (Shape("100m", "random ~100M Llama", LLAMA_100M),
          # fp32 reads ~4 GB of weights a decode step on one core (~0.25 s): one request at c=1, a c=4 warm-up,
          # one round, one shared-prefix sample
          Shape("1b", "random Llama-3.2-1B-shaped", LLAMA_1B, sequential=1, warm=4, max_repeats=1,
                prefix_samples=1, run_seconds=1200.0))


def quick(shape: Shape) -> Shape:
    """A smoke-sized version: two concurrencies, short outputs, few prompts."""
    return replace(shape, concurrency=(1, 4), sequential=2, warm=4, new_tokens=16, greedy_prompts=2, greedy_tokens=8,
                   prefix_tokens=256, prefix_samples=1, max_repeats=1)


def try_build(model: Path, work: Path, precision: str) -> Path | str:
    """The bundle folder, or why it did not build (a failed build is remembered for this source version)."""
    out = work / f"mbuild-{model.name}-{precision}-{source_hash()}"
    for stale in work.glob(f"mbuild-{model.name}-{precision}-*"):
        if stale != out:
            shutil.rmtree(stale)
    failed = out / "build-failed.txt"
    if failed.is_file():
        return failed.read_text()
    if out.is_dir() and not (out / "report.json").is_file():  # an interrupted build: start again
        shutil.rmtree(out)
    try:
        return build_mbuild(model, out, precision=precision).parent
    except subprocess.CalledProcessError as error:
        lines = [line for line in (error.stderr or b"").decode(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error")]
        reason = (errors or lines or [f"exit status {error.returncode}"])[-1]
        out.mkdir(parents=True, exist_ok=True)
        failed.write_text(reason)
        return reason


def build_or_engine(model: Path, work: Path, precision: str) -> tuple[Path | str, str | None]:
    """The bundle, or why it did not build; when only its gate failed, the engine it built (served with
    --allow-failed-gate) and the gate's summary."""
    build = try_build(model, work, precision)
    engine = work / f"mbuild-{model.name}-{precision}-{source_hash()}"
    gate = engine / "report.json"
    if isinstance(build, str) and gate.is_file() and (engine / "model" / "engine.json").is_file():
        return engine, str(json.loads(gate.read_text())["summary"])
    return build, None


def context_of(builds: dict[str, Path | str], model: Path) -> int:
    """Tokens per sequence in mbuild's engine (its profile's limits.context, capped by the model)."""
    for build in builds.values():
        if isinstance(build, Path):
            return int(json.loads((build / "model" / "engine.json").read_text())["max_seq_length"])
    return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])


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


def served_name(port: int) -> str:
    return str(httpx.get(f"http://{HOST}:{port}/v1/models", timeout=10).json()["data"][0]["id"])


def measure_pair(shape: Shape, pair: tuple[str, str], build: Path | str, gguf: Path, context: int,
                 texts: Texts, repeats: int, results: dict[str, Any]) -> None:
    """Both servers of a pair up on one server core, their cases interleaved; the checks on the way. An mbuild
    build that failed leaves llama.cpp measured alone."""
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
        stack.enter_context(server(llamacpp.serve(gguf, ports["llama"], context), "/health", ports["llama"],
                                   cpus=core))
        urls[f"llama.cpp {pair[1]}"] = f"{base['llama']}/v1/completions"
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
    if pair[0] == "fp32":
        ids = [texts.ids(text) for text in (prompts * 8)[:shape.greedy_prompts]]
        results["greedy"][shape.key] = greedy(base["mbuild"], base["llama"], served, texts, ids, shape.greedy_tokens)
        print(f"  greedy {shape.key}: {results['greedy'][shape.key]['equal']}/{len(ids)} prompts equal")
    if pair[0] == results["prefix_pair"].get(shape.key):
        mine = bodies([""], replace(shape, new_tokens=4), served, texts.silent())[0]
        theirs = {**bodies([""], replace(shape, new_tokens=4), None, texts.silent())[0], "cache_prompt": True}
        args = (texts, shape.prefix_tokens, shape.prefix_samples, PREFIX_SEED)
        results["prefix"][shape.key] = {"pair": list(pair),
                                        "mbuild": prefix_ttft(f"{base['mbuild']}/v1/completions", mine, *args),
                                        "llama.cpp": prefix_ttft(f"{base['llama']}/v1/completions", theirs, *args)}
        print(f"  shared prefix {shape.key}: " + ", ".join(
            f"{k} cached/uncached {v['ratio']:.2f}" for k, v in results["prefix"][shape.key].items() if k != "pair"))


def measure_shape(shape: Shape, work: Path, repeats: int, results: dict[str, Any]) -> None:
    model = make_llama_spm(work / f"llama-{shape.key}-spm", shape.config, llamacpp.SPM_VOCAB)
    files = llamacpp.ggufs(model, work / "gguf")
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
        measure_pair(shape, (mine, theirs), builds[mine], files[theirs], context, texts, repeats, results)


def main(repeats: int = 3, work: Path | None = None, quick_mode: bool | None = None) -> Path:
    """`python -m bench llm_peer`; BENCH_PEER_QUICK=1 (or quick_mode) runs a smoke-sized version that writes
    next to its work folder instead of docs/; BENCH_PEER_SHAPES=100m,1b picks the shapes."""
    quick_mode = os.environ.get("BENCH_PEER_QUICK") == "1" if quick_mode is None else quick_mode
    work = work or Path(tempfile.gettempdir()) / "mbuild-bench-peer"
    chosen = os.environ.get("BENCH_PEER_SHAPES", "100m" if quick_mode else "100m,1b").split(",")
    shapes = [quick(s) if quick_mode else s for s in SHAPES if s.key in chosen]
    print(f"llama.cpp peer benchmark: work in {work}, {repeats} rounds{' (quick)' if quick_mode else ''}")
    llamacpp.ensure_built()
    results: dict[str, Any] = {"runs": {}, "greedy": {}, "prefix": {}, "builds": {}, "context": {},
                               "prefix_pair": {}, "ungated": {}, "step_bytes": {}, "run_flops": {}}
    with pinned({min(split_cores()[1])}):  # the servers' core: the floors every server runs against
        results["read_gbs"], results["peak_gflops"] = read_rate_gbs(), fp32_peak_gflops()
    for shape in shapes:
        measure_shape(shape, work, repeats, results)
    data, markdown = report(results, shapes, PAIRS, repeats, quick_mode, __doc__ or "")
    out = work / "quick" if quick_mode else OUT
    path = write("llm_peer", data, markdown, out)
    plot(results, shapes, PAIRS, out / "llm_peer.png")
    print(markdown)
    return path
