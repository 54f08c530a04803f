"""Served decode time (TPOT) against the context: does a served stream slow down as its context grows?

A random ~25M Llama (8 layers, hidden 256, 4 KV heads of 64: 16 KiB of fp32 cache a token) on a word-level
vocabulary of 32000, built `--precision fp32` and at the CPU default (int8), each served by `mbuild serve` pinned to
one core with one thread, the client on the other core. Each request streams 64 tokens (ignore_eos) after a prompt of
`context` token ids; its TPOT is the median gap between streamed tokens after the first. Contexts 16, 512 and 1500,
interleaved per round. A step that copies nothing still reads every cached position once, so TPOT grows with the
context by at least that read at the core's read rate (measured here: the best of five numpy maxima over 1 GiB on
the server's core); the page gives the growth, the cache bytes added, the rate they were read at, and the bound
(TPOT at 1500 within 1.3x of TPOT at 16).

mbuild alone: llama.cpp's context scaling is on llm_context's page (in-process steps, the same kind of read); this
one measures what a client of the served endpoint sees.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.lib.harness import OUT, Series, interleave, machine, read_rate_gbs, work_folder, write
from bench.lib.llm_models import make_llama_words
from bench.lib.mbuild import build_or_engine
from bench.lib.servers import HOST, free_port, mbuild_serve, served_name, server, split_cores
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "served TPOT against the context, with the cache's read rate"

SHAPE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 8,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 2048,
                         "tie_word_embeddings": False}
CONTEXTS = (16, 512, 1500)
NEW_TOKENS = 64
BOUND = 1.3  # issue 57: TPOT at 1,500 tokens of context within 1.3x of 16, on a small fp32 model
PRECISIONS = ("fp32", "int8")


def cache_bytes(context: int, element: int = 4) -> int:
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    return context * SHAPE["num_hidden_layers"] * 2 * SHAPE["num_key_value_heads"] * head_dim * element


def tpot_ms(port: int, name: str, context: int) -> float:
    """One streamed completion after `context` prompt ids: the median gap between its tokens after the first."""
    body = {"model": name, "prompt": [3 + (i * 7919) % 31000 for i in range(context)], "max_tokens": NEW_TOKENS,
            "temperature": 0, "stream": True, "ignore_eos": True}
    stamps = []
    with httpx.stream("POST", f"http://{HOST}:{port}/v1/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps[1:])]  # after the first token
    return statistics.median(gaps) * 1e3


def main(repeats: int = 5, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench served_context [--repeats N]`."""
    work = work or work_folder("served-context", quick)
    model = make_llama_words(work / "llama-25m", SHAPE)
    client, cores = split_cores()
    core = {min(cores)}
    os.sched_setaffinity(0, core)
    rate = read_rate_gbs()  # on the core the servers run on
    os.sched_setaffinity(0, client)
    results: dict[str, Series] = {}
    notes: dict[str, str] = {}
    for precision in PRECISIONS:
        built, gate = build_or_engine(model, work, precision)
        if isinstance(built, str):
            notes[precision] = f"did not build: {built}"
            continue
        if gate:
            notes[precision] = f"served with --allow-failed-gate (random weights): {gate}"
        port = free_port()
        command = [*mbuild_serve(built, port), *(["--allow-failed-gate"] if gate else [])]
        with server(command, READY, port, {"MBUILD_THREADS": "1"}, cpus=core):
            name = served_name(port)
            tpot_ms(port, name, CONTEXTS[-1])  # warm: the first long prompt commits the cache's pages
            cases: list[tuple[str, Callable[[], float]]] = [
                (f"{precision} ctx{context}", partial(tpot_ms, port, name, context)) for context in CONTEXTS]
            results.update(interleave(cases, 1 if quick else repeats))
    data = {"machine": machine(), "unit": "ms between streamed tokens (lower is better)", "read_gbs": rate,
            "contexts": list(CONTEXTS), "notes": notes, "results": {k: v.values for k, v in results.items()}}
    return write("served_context", data, _markdown(results, rate, notes), out, measures=MEASURES)


def _markdown(results: dict[str, Series], rate: float, notes: dict[str, str]) -> str:
    short, long = CONTEXTS[0], CONTEXTS[-1]
    lines = ["# Served TPOT against the context", "", __doc__.strip(), "",
             f"One core's read rate: {rate:.1f} GB/s. Median TPOT in ms over the rounds (min-max).", "",
             "| build | " + " | ".join(f"ctx {c}" for c in CONTEXTS) + f" | ctx {long} / ctx {short} | bound |",
             "| --- | " + " | ".join("---:" for _ in CONTEXTS) + " | ---: | --- |"]
    for precision in PRECISIONS:
        series = [results.get(f"{precision} ctx{c}") for c in CONTEXTS]
        if not all(series):
            continue
        cells = " | ".join(f"{s.median:.2f} ({s.spread(2)})" for s in series if s)
        ratio = series[-1].median / series[0].median  # type: ignore[union-attr]
        lines.append(f"| {precision} | {cells} | {ratio:.2f}x | {'met' if ratio <= BOUND else 'not met'} |")
    lines += ["", "What the fp32 build's growth reads: the cache bytes a step adds from ctx 16 to ctx 1500, the time "
              "reading them takes at the core's rate (the floor), and the rate the growth implies.", "",
              "| build | growth ms | cache bytes added MB | floor ms | implied read GB/s |",
              "| --- | ---: | ---: | ---: | ---: |"]
    added = cache_bytes(long) - cache_bytes(short)
    first, last = results.get(f"fp32 ctx{short}"), results.get(f"fp32 ctx{long}")
    if first and last:
        growth = last.median - first.median
        implied = f"{added / growth / 1e6:.1f}" if growth > 0 else "-"
        lines.append(f"| fp32 | {growth:.2f} | {added / 1e6:.1f} | {added / rate / 1e6:.2f} | {implied} |")
    lines += ["", *(f"- {precision}: {note}" for precision, note in notes.items()), "",
              "Reproduce: `python -m bench served_context --repeats 5`"]
    return "\n".join(lines) + "\n"
