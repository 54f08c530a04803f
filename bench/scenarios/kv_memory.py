"""What a language-model server holds in memory, ready and under a burst, beside llama.cpp's server on the same weights.

An llm_peer shape (a random ~100M Llama on the Llama SPM vocabulary, or with `--shape 1b` Llama-3.2-1B's shape), 16
slots of 2,048 tokens on every server: `mbuild serve` (MBUILD_MAX_BATCH=16, MBUILD_THREADS=1) and llama-server
(`--parallel 16 -c 32768`, its default f16 KV cache), each alone on the server core, one after another. Per arm:
the RSS of the server's process tree once it is ready (its health route answers, then a 3 s settle), and its peak,
sampled every 50 ms, through two bursts of 16 streamed completions sent at once, 64 new tokens each (ignore_eos):
short prompts of 64 tokens, then long ones of 1,000 (17,024 tokens in all: more than a quarter pool holds at once,
so there it queues and preempts); the requests not answered in full are counted. mbuild arms: fp32 (what `mbuild
package` picks for this model where its int8 fails the gate on random weights, as on the AVX-512 VNNI profile;
the AVX2 profile's passes), int8 (the CPU profiles' first choice, served past its gate where it fails, with the
int8 KV cache a build that passes keeps: bench/lib/mbuild.py), and int8 with a KV pool of a quarter of 16 x 2,048
tokens (MBUILD_KV_CACHE_MB), which must still serve the 16 at once. llama.cpp arms: its f32 and q8_0 GGUFs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from bench.lib import decode_steps, llamacpp
from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_client import stream_one
from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY, make_llama_spm
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.mbuild import build_or_engine
from bench.lib.rss import tree_memory
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.bundle.engine import KV_BLOCK_TOKENS
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "server memory, ready and under a burst, beside llama.cpp"

SLOTS, CONTEXT, NEW, LONG_PROMPT = 16, 2048, 64, 1000
SHAPES: dict[str, dict[str, Any]] = {"100m": LLAMA_100M, "1b": LLAMA_1B}
SETTLE_S, SAMPLE_S = 3.0, 0.05
MB = 1 << 20


def _per_token(build: Path) -> int:
    """The engine's keys and values of one token, from its shape and its cache's type."""
    options = json.loads((build / "model" / "engine.json").read_text())["options"]
    return int(2 * options["layers"] * options["kv_heads"] * options["head_dim"]
               * np.dtype(decode_steps.cache_type(build / "model")).itemsize)


def _pool_mb(build: Path) -> int:
    """A quarter of the slots' whole contexts, in MB."""
    return max(1, SLOTS * CONTEXT * _per_token(build) // 4 // MB)


def _mbuild_command(build: Path, flags: list[str], port: int) -> list[str]:
    return mbuild_serve(build, port) + flags


def _llama_command(gguf: Path, port: int) -> list[str]:
    return llamacpp.serve(gguf, port, CONTEXT, SLOTS)


def _burst(url: str, payloads: list[dict[str, Any]]) -> int:
    """All payloads at once; how many did not stream their tokens in full."""
    async def go() -> int:
        async with httpx.AsyncClient(timeout=600) as client:
            done = await asyncio.gather(*(stream_one(client, url, p, len) for p in payloads), return_exceptions=True)
        return sum(isinstance(result, BaseException) for result in done)
    return asyncio.run(go())


def _measure(command: list[str], port: int, env: dict[str, str] | None, core: set[int], mbuild: bool,
             texts: Texts, bursts: dict[str, list[str]]) -> dict[str, Any]:
    roots: list[int] = []
    with ExitStack() as stack:
        stack.enter_context(server(command, READY if mbuild else "/health", port, env, cpus=core,
                                   started=roots))
        time.sleep(SETTLE_S)
        root = psutil.Process(roots[0])
        ready = tree_memory(root)[0]
        extra = {"model": served_name(port)} if mbuild else {"cache_prompt": False}
        found: dict[str, Any] = {"ready_mb": ready / MB}
        for name, prompts in bursts.items():
            payloads = [{"prompt": p, "max_tokens": NEW, "min_tokens": NEW, "ignore_eos": True, "temperature": 0.0,
                         "logit_bias": texts.silent(), "stream": True, "stream_options": {"include_usage": True},
                         **extra} for p in prompts]
            peak, stop = [tree_memory(root)[0]], threading.Event()

            def sample(into: list[int] = peak, until: threading.Event = stop) -> None:
                while not until.wait(SAMPLE_S):
                    into.append(tree_memory(root)[0])
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            failed = _burst(f"http://{HOST}:{port}/v1/completions", payloads)
            found[name] = {"peak_mb": max(peak) / MB, "failed": failed, "wall_s": time.perf_counter() - started}
            stop.set()
            sampler.join()
        found["after_mb"] = tree_memory(root)[0] / MB
        if mbuild:  # what the pool did: sequences preempted, queued requests' waits are in the burst's time
            metrics = httpx.get(f"http://{HOST}:{port}/metrics", timeout=10).text
            found["preemptions"] = next((float(line.split()[-1]) for line in metrics.splitlines()
                                         if line.startswith("mbuild_preemptions_total")), None)
    return found


def _markdown(results: dict[str, Any], doc: str, quick: bool) -> str:
    arms = results["arms"]
    lines = [f"# Server memory, ready and under a burst{' (quick)' if quick else ''}", "", doc.strip(), "",
             "Reproduce: `python -m bench kv_memory`.", "",
             "| server | RSS at ready MB | peak, 16 short MB | not served | s | peak, 16 long MB | not served | s "
             "| after MB |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in arms.items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | | | | | | |")
            continue
        short, long = row["short"], row["long"]
        lines.append(f"| {name} | {row['ready_mb']:.0f} | {short['peak_mb']:.0f} | {short['failed']} | "
                     f"{short['wall_s']:.1f} | {long['peak_mb']:.0f} | {long['failed']} | {long['wall_s']:.1f} | "
                     f"{row['after_mb']:.0f} |")
    pairs = (("mbuild fp32", "llama.cpp f32"), ("mbuild int8", "llama.cpp q8_0"),
             ("mbuild int8, pool 1/4", "llama.cpp q8_0"))
    lines += ["", "| mbuild / llama.cpp | at ready | peak, short | peak, long |", "| --- | ---: | ---: | ---: |"]
    for mine, theirs in pairs:
        a, b = arms.get(mine, {}), arms.get(theirs, {})
        if "ready_mb" in a and "ready_mb" in b:
            lines.append(f"| {mine} / {theirs} | {a['ready_mb'] / b['ready_mb']:.2f}x | "
                         f"{a['short']['peak_mb'] / b['short']['peak_mb']:.2f}x | "
                         f"{a['long']['peak_mb'] / b['long']['peak_mb']:.2f}x |")
    if results.get("pool_mb"):
        lines += ["", f"The pool arm: MBUILD_KV_CACHE_MB={results['pool_mb']} (a quarter of 16 x 2,048 tokens of "
                  "its keys and values)."]
    per_token = results.get("kv_bytes_per_token")
    if per_token:
        held = SLOTS * (results["long_prompt"] + NEW)
        cached = SLOTS * (results["long_prompt"] // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS)
        lines += ["", f"What the long burst holds: {held:,} tokens of keys and values, {held * per_token / MB:.0f} MB "
                  f"in mbuild's {results.get('kv_cache_type', 'float32')} cache ({per_token:,} B a token; llama.cpp's "
                  "f16 cache takes 2 B a value), inside the pool, which the quarter pool bounds; each prompt's "
                  f"whole blocks ({cached:,} tokens) stay in their slot as the prefix cache, no copy: it preempted "
                  f"{arms.get('mbuild int8, pool 1/4', {}).get('preemptions', 0):.0f} sequences on the way (recomputed "
                  "after; requests not served are counted above)."]
    return "\n".join(lines) + "\n"


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench kv_memory`."""
    parser = argparse.ArgumentParser(prog="python -m bench kv_memory")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="100m",
                        help="llm_peer's model shape (default: %(default)s); another reports to kv_memory-SHAPE.md")
    return {"shape": parser.parse_args(argv).shape}


def main(repeats: int = 1, quick: bool = False, out: Path = OUT, work: Path | None = None, shape: str = "100m"
         ) -> Path:
    """`python -m bench kv_memory [--shape 100m|1b]` (one pass: memory is not a rate; --repeats is not used)."""
    work = work or work_folder(f"kv_memory-{shape}", quick)
    llamacpp.ensure_source()
    peer = llamacpp.peer(quick)
    model = make_llama_spm(work / "llama-spm", LLAMA_TINY if quick else SHAPES[shape], llamacpp.SPM_VOCAB)
    files = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf", kinds=("f32", "q8_0")) if peer else {}
    texts = Texts(model)
    long = 100 if quick else LONG_PROMPT
    bursts = {"short": [texts.text(PROMPT_TOKENS, seed) for seed in range(SLOTS)],
              "long": [texts.text(long, 100 + seed) for seed in range(SLOTS)]}
    results: dict[str, Any] = {"machine": machine(), "shape": shape, "slots": SLOTS, "context": CONTEXT, "arms": {},
                               "long_prompt": 100 if quick else LONG_PROMPT}
    client, servers = split_cores()
    core = {min(servers)}
    env = {"MBUILD_MAX_BATCH": str(SLOTS), "MBUILD_THREADS": "1"}
    arms: dict[str, tuple[Callable[[int], list[str]], dict[str, str], bool]] = {}  # name: (command, env, mbuild's)
    for precision in ("fp32", "int8"):
        build, gate = build_or_engine(model, work, precision)
        if isinstance(build, str):
            results["arms"][f"mbuild {precision}"] = {"error": f"did not build: {build[:200]}"}
            continue
        flags = ["--allow-failed-gate"] if gate else []
        arms[f"mbuild {precision}"] = (partial(_mbuild_command, build, flags), env, True)
        if precision == "int8":
            results["pool_mb"], results["kv_bytes_per_token"] = _pool_mb(build), _per_token(build)
            results["kv_cache_type"] = decode_steps.cache_type(build / "model")
            arms["mbuild int8, pool 1/4"] = (arms["mbuild int8"][0],
                                             {**env, "MBUILD_KV_CACHE_MB": str(results["pool_mb"])}, True)
    for kind, gguf in files.items():
        arms[f"llama.cpp {kind}"] = (partial(_llama_command, gguf), {}, False)
    with pinned(client):
        for name, (command, variables, mbuild) in arms.items():
            port = free_port()
            print(f"  {name}: serving on port {port}")
            try:
                results["arms"][name] = _measure(command(port), port, variables, core, mbuild, texts, bursts)
            except Exception as exc:  # an arm that fails is a result: say which and why
                results["arms"][name] = {"error": str(exc).splitlines()[0][:300]}
            print(f"  {name}: {results['arms'][name]}")
    markdown = _markdown(results, __doc__ or "", quick)
    path = write("kv_memory" if shape == "100m" else f"kv_memory-{shape}", results, markdown, out,
                 measures=MEASURES + ("" if shape == "100m" else f", the {shape} shape"))
    print(markdown)
    return path
