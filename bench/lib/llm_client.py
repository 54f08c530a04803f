"""The streaming client of the served language-model benchmarks, timing requests as vLLM's benchmark_serving does.

A run sends its requests one after another at concurrency 1, or all at once as one wave, and every request
must stream exactly its `max_tokens` (the bodies ask for ignore_eos and min_tokens).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

RUN_SECONDS = 300.0  # default bound on one run (all its requests), so a stuck server fails the benchmark

Counter = Callable[[str], int]


@dataclass
class Timing:
    """One streamed request, timed as vLLM's benchmark_serving times it."""

    ttft: float  # s from sending to the first chunk with non-empty text
    latency: float  # s from sending to the end of the stream
    tokens: int
    prompt_tokens: int = 0  # as the server's usage reports it; 0 when it sends none
    draft_n: int = 0  # draft tokens the server verified for it (llama.cpp's `timings`, which mbuild also sends)
    draft_n_accepted: int = 0  # and of them accepted

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / max(self.tokens - 1, 1)


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """A stream's lines as SSE ends them (LF, CRLF): httpx's aiter_lines also ends one at U+0085, U+2028 and U+2029,
    which a server may send raw inside a JSON string (llama.cpp does), cutting an event in two."""
    held = ""
    async for text in response.aiter_text():
        *lines, held = (held + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if held:
        yield held.removesuffix("\r")


def sse_data(line: str) -> dict[str, Any] | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    data: dict[str, Any] = json.loads(line[len("data: "):])
    if "error" in data:
        raise RuntimeError(f"error in the stream: {data['error']}")
    return data


@dataclass
class Streamed:
    """One SSE completion as it came: time to its first text, its whole time, its text, its last usage and timings."""

    ttft: float
    latency: float
    text: str
    usage: dict[str, Any]
    timings: dict[str, Any]


async def streamed(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> Streamed:
    started = time.perf_counter()
    ttft, text = 0.0, []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    async with client.stream("POST", url, json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code} {(await response.aread())[:200]!r}")
        async for line in sse_lines(response):
            data = sse_data(line)
            if data is None:
                continue
            piece = data["choices"][0].get("text") if data.get("choices") else ""
            if piece:
                ttft = ttft or time.perf_counter() - started
                text.append(piece)
            usage = data.get("usage") or usage
            timings = data.get("timings") or timings
    return Streamed(ttft, time.perf_counter() - started, "".join(text), usage, timings)


async def stream_one(client: httpx.AsyncClient, url: str, payload: dict[str, Any], count: Counter) -> Timing:
    """Time one SSE completion; output tokens from the final usage chunk, else `count` of the streamed text.
    Fails unless it streamed exactly payload["max_tokens"] tokens."""
    got = await streamed(client, url, payload)
    usage, timings, ttft = got.usage, got.timings, got.ttft
    tokens = usage.get("completion_tokens") or count(got.text)
    timing = Timing(ttft, got.latency, tokens, usage.get("prompt_tokens", 0),
                    int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0)))
    if timing.tokens != payload["max_tokens"] or not ttft:
        raise RuntimeError(f"{url}: {timing.tokens} tokens streamed, expected {payload['max_tokens']}")
    return timing


async def wave(url: str, payloads: list[dict[str, Any]], concurrency: int, count: Counter,
               seconds: float = RUN_SECONDS) -> tuple[list[Timing], float]:
    """The payloads one after another (concurrency 1) or all at once; their timings and the wall time."""
    async with httpx.AsyncClient(timeout=seconds) as client:
        started = time.perf_counter()
        if concurrency == 1:
            timings = [await stream_one(client, url, p, count) for p in payloads]
        else:
            timings = list(await asyncio.gather(*(stream_one(client, url, p, count) for p in payloads)))
        return timings, time.perf_counter() - started


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


def summarize(timings: list[Timing], wall: float) -> dict[str, float]:
    ttfts = [t.ttft * 1000 for t in timings]
    tpots = [t.tpot * 1000 for t in timings]
    tpot = statistics.median(tpots)
    return {"total_tok_s": sum(t.tokens for t in timings) / wall, "user_tok_s": 1000 / tpot,
            "e2e_user_tok_s": statistics.median(t.tokens / t.latency for t in timings),
            "ttft_p50_ms": statistics.median(ttfts), "ttft_p99_ms": _p99(ttfts), "tpot_p50_ms": tpot,
            "tpot_p99_ms": _p99(tpots), "prompt_tokens_min": min(t.prompt_tokens for t in timings),
            "prompt_tokens_max": max(t.prompt_tokens for t in timings)}


def run(url: str, payloads: list[dict[str, Any]], concurrency: int, count: Counter,
        runs: list[dict[str, float]], seconds: float = RUN_SECONDS) -> float:
    """One run; its metrics go to `runs`, its total output tokens/s back to the harness."""
    timings, wall = asyncio.run(asyncio.wait_for(wave(url, payloads, concurrency, count, seconds), seconds))
    runs.append(summarize(timings, wall))
    return runs[-1]["total_tok_s"]
