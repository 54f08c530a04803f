"""The speculative decoding benchmark's four servers and their runs: mbuild without and with speculation (n-gram
lookup, or its bundle's draft model), llama.cpp's llama-server without and with its own (the same method; its
`-md` draft model a GGUF of the same checkpoint), all up on one pinned core, measured one at a time with their
cases interleaved, and the checks on the way (each server's greedy output against the analytic continuation;
mbuild's Prometheus draft counters against the per-response timings).

The results dict it fills: runs (each case's rounds, with the drafts its responses reported), follows (tokens of
the expected continuation each arm's greedy answer gives, by prompt kind) and metrics (mbuild's counter check).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib import llamacpp
from bench.lib.harness import interleave
from bench.lib.llm_client import RUN_SECONDS, summarize, wave
from bench.lib.llm_peer_checks import Texts
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from bench.lib.spec_prompts import LOOKUP_MAX, LOOKUP_MIN, NEW_TOKENS, Kind, prompts
from runtimes.generation.speculative import DEFAULT_DRAFTS
from runtimes.health import READY

COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
Prompt = tuple[list[int], list[int]]  # (prompt ids, expected continuation)
CHECK_SEED = 1_000_000  # the checks' and warm-up's prompts, apart from the rounds' (seeds from 0)
PAIRS = 4  # waves each of mbuild's arms runs a round (Plan.waves)


@dataclass(frozen=True)
class Plan:
    """What a run measures: prompt kinds, concurrencies, requests at c=1 (one after another), rounds, and how many
    waves mbuild's two arms alternate a round."""

    kinds: tuple[Kind, ...]
    method: str = "ngram"  # or "draft": what the speculating arms do
    concurrency: tuple[int, ...] = (1, 4, 16)
    sequential: int = 4
    repeats: int = 3
    run_seconds: float = RUN_SECONDS
    pairs: int = PAIRS

    def count(self, concurrency: int) -> int:
        return self.sequential if concurrency == 1 else concurrency

    def arms(self, server: str) -> tuple[str, str]:
        return f"{server} off", f"{server} {self.method}"

    def waves(self, server: str) -> int:
        """Waves each of a server's arms runs a round (at c=1 a wave is `sequential` requests one after another):
        mbuild's alternate `pairs` times, since the done-when lines (at c=16 at most 5% lost, at c=1 1.8x) are finer
        than this host's drift between waves a few seconds apart (c=1 round ratios 1.33-2.07x in one run), so its
        on / off is taken over many adjacent pairs; llama.cpp's one."""
        return self.pairs if server == "mbuild" else 1


def mbuild_env(method: str) -> dict[str, str]:
    """mbuild's server settings for an arm: one thread, speculation `method` (off, ngram or draft) at its default
    drafts a row (DEFAULT_DRAFTS), and the lookup's sizes."""
    return {"MBUILD_THREADS": "1", "MBUILD_SPECULATIVE": method,
            "MBUILD_PROMPT_LOOKUP_MIN": str(LOOKUP_MIN), "MBUILD_PROMPT_LOOKUP_MAX": str(LOOKUP_MAX)}


def body(ids: list[int], served: str | None, stream: bool = True) -> dict[str, Any]:
    """A greedy request of exactly NEW_TOKENS tokens; mbuild's names its model (`served`), llama.cpp's turns its
    prompt cache off."""
    extra = {"model": served} if served else {"cache_prompt": False}
    streamed = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    return {"prompt": ids, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "ignore_eos": True,
            "temperature": 0.0, **streamed, **extra}


def run_case(url: str, sets: Iterator[list[dict[str, Any]]], concurrency: int, runs: list[dict[str, float]],
             seconds: float) -> float:
    """One run of the next payload set: its metrics, and the drafts its responses reported, go to `runs`."""
    timings, wall = asyncio.run(asyncio.wait_for(wave(url, next(sets), concurrency, len, seconds), seconds))
    drafted, accepted = sum(t.draft_n for t in timings), sum(t.draft_n_accepted for t in timings)
    runs.append({**summarize(timings, wall), "draft_n": drafted, "draft_n_accepted": accepted,
                 "tokens": sum(t.tokens for t in timings)})
    return runs[-1]["total_tok_s"]


Case = tuple[str, Callable[[], float]]


def run_pairs(urls: tuple[str, ...], sets: tuple[Iterator[list[dict[str, Any]]], ...], concurrency: int,
              runs: tuple[list[dict[str, float]], ...], waves: int, seconds: float) -> float:
    """A server's off and on arms, `waves` runs each, alternating which goes first (off on, on off, ...) so neither
    always meets the host's state the other left; returns the median of the adjacent pairs' on / off."""
    ratios = []
    for turn in range(waves):
        order = (0, 1) if turn % 2 == 0 else (1, 0)
        got = {arm: run_case(urls[arm], sets[arm], concurrency, runs[arm], seconds) for arm in order}
        ratios.append(got[1] / got[0])
    return statistics.median(ratios)


def cases(plan: Plan, urls: dict[str, str], served: str, order: np.ndarray, runs: dict[str, list[dict[str, float]]],
          seed: int) -> list[Case]:
    """Every (kind, c, server) case, its off and on arms run back to back; within a round all arms get the same
    prompts (a server's further waves fresh ones), each round fresh ones (no prefix is ever cached)."""
    found: list[Case] = []
    for index, kind in enumerate(plan.kinds):
        for concurrency in plan.concurrency:
            most = plan.waves("mbuild")  # the most waves a server runs a round
            rounds = [[[ids for ids, _ in prompts(kind, order, plan.count(concurrency),
                                                  seed + 10_000 * r + 100 * index + concurrency + 1_000 * w)]
                       for w in range(most)] for r in range(plan.repeats)]
            for side in ("mbuild", "llama.cpp"):
                arms = plan.arms(side)
                if arms[0] not in urls:
                    continue
                waves, name = plan.waves(side), served if side == "mbuild" else None
                payloads = [[body(ids, name) for ids in ids_set] for sets_ in rounds for ids_set in sets_[:waves]]
                sets = tuple(iter(payloads) for _ in arms)
                for arm in arms:
                    runs[f"{kind.key} {arm} c={concurrency}"] = []
                found.append((f"{kind.key} {side} {plan.method} / off c={concurrency}",
                              partial(run_pairs, tuple(urls[arm] for arm in arms), sets, concurrency,
                                      tuple(runs[f"{kind.key} {arm} c={concurrency}"] for arm in arms), waves,
                                      plan.run_seconds)))
    return found


def follows(url: str, served: str | None, texts: Texts, sample: Prompt) -> int:
    """How many tokens of the expected continuation a greedy answer (not streamed) gives, read from its text (mbuild
    drops the opening space of a completion; a leading space is not counted against either)."""
    ids, expected = sample
    text = httpx.post(url, json=body(ids, served, stream=False), timeout=600).raise_for_status().json()
    got = text["choices"][0]["text"].lstrip(" ")
    return max((k for k in range(len(expected) + 1)
                if got.startswith(texts.continuation(ids, expected[:k]).lstrip(" "))), default=0)


def counters(base: str) -> dict[str, float]:
    """mbuild's speculative decoding counters from its /metrics (summed over labels)."""
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


@dataclass(frozen=True)
class Peers:
    """What the arms serve: mbuild's bundle (or why it did not build), llama.cpp's GGUF and, for draft arms, its
    draft model's GGUF."""

    build: Path | str
    gguf: Path | None
    context: int
    ungated: bool
    draft_gguf: Path | None = None


def _llama_flags(plan: Plan, peers: Peers) -> list[str]:
    if plan.method == "ngram":
        return llamacpp.ngram_flags(DEFAULT_DRAFTS["ngram"], LOOKUP_MIN)
    assert peers.draft_gguf is not None
    return llamacpp.draft_flags(peers.draft_gguf, DEFAULT_DRAFTS["draft"])


def _servers(stack: ExitStack, plan: Plan, peers: Peers) -> tuple[dict[str, str], dict[str, str]]:
    """The arms' completion URLs and base URLs, their servers started on the servers' core."""
    core = {min(split_cores()[1])}
    bases = {}
    build, gguf, context, ungated = peers.build, peers.gguf, peers.context, peers.ungated
    if isinstance(build, Path):
        for arm in plan.arms("mbuild"):
            port = free_port()
            command = mbuild_serve(build, port) + (["--allow-failed-gate"] if ungated else [])
            stack.enter_context(server(command, READY, port, mbuild_env(arm.split()[1]), cpus=core))
            bases[arm] = f"http://{HOST}:{port}"
    if gguf is not None:
        for arm in plan.arms("llama.cpp"):
            port = free_port()
            flags = _llama_flags(plan, peers) if arm.endswith(plan.method) else []
            stack.enter_context(server([*llamacpp.serve(gguf, port, context), *flags], "/health", port, cpus=core))
            bases[arm] = f"http://{HOST}:{port}"
    return {arm: f"{base}/v1/completions" for arm, base in bases.items()}, bases


def measure(plan: Plan, peers: Peers, texts: Texts, order: np.ndarray, results: dict[str, Any],
            seed: int = 0) -> None:
    """Up every arm that built (mbuild's two from one build, llama.cpp's two from one GGUF); warm each with a wave at
    the top concurrency, check each follows the analytic continuation on every kind, then the interleaved rounds."""
    check = seed + CHECK_SEED
    with ExitStack() as stack:
        urls, bases = _servers(stack, plan, peers)
        served = served_name(int(bases["mbuild off"].rsplit(":", 1)[1])) if "mbuild off" in bases else ""
        stack.enter_context(pinned(split_cores()[0]))
        for arm, url in urls.items():
            name = served if arm.startswith("mbuild") else None
            results["follows"][arm] = {kind.key: follows(url, name, texts, prompts(kind, order, 1, check)[0])
                                       for kind in plan.kinds}
            top = max(plan.concurrency)
            warm = [body(ids, name) for ids, _ in prompts(plan.kinds[0], order, top, check + 1)]
            warmed = run_case(url, iter([warm]), top, [], plan.run_seconds)
            print(f"  warm-up {arm} c={top}: {warmed:.1f} tokens/s; follows the analytic continuation: "
                  + ", ".join(f"{k} {n}/{NEW_TOKENS}" for k, n in results["follows"][arm].items()), flush=True)
        speculating = plan.arms("mbuild")[1]
        before = counters(bases[speculating]) if speculating in bases else {}
        runs: dict[str, list[dict[str, float]]] = {}
        interleave(cases(plan, urls, served, order, runs, seed), plan.repeats)
        results["runs"].update(runs)
        if before:
            after = counters(bases[speculating])
            mine = [r for name, rounds in runs.items() if f" {speculating} " in name for r in rounds]
            results["metrics"] = {
                "counters": {name: after[name] - before[name] for name in COUNTERS},
                "timings": {"draft_n": sum(r["draft_n"] for r in mine),
                            "draft_n_accepted": sum(r["draft_n_accepted"] for r in mine)}}
