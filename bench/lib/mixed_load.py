"""The load of the mixed-step benchmark (bench/scenarios/mixed_step.py): streams that are decoding when long prompts
arrive, timed token by token, so what a prompt's prefill costs the streams already running is seen as their gaps.

One round: `streams` requests of a short prompt start at once and decode `new_tokens` each; once every one has its
first token, the long prompts are sent `spacing` seconds apart, each asking for one token. A stream's gaps are the
times between its successive tokens; the window is from the first long prompt sent to the last one answered, and
only gaps that end inside it count as "during". Gaps before it are the quiet baseline.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.lib.llm_client import sse_data, sse_lines


@dataclass(frozen=True)
class Load:
    streams: int = 4  # running streams
    stream_prompt: int = 64  # their prompt tokens
    new_tokens: int = 1024  # tokens each stream decodes: long enough to outlive the long prompts' prefill
    long_prompts: int = 2  # prompts that arrive while the streams run
    long_tokens: int = 1920  # their length: ~2k, within the 2048-token context with the answer's token
    spacing: float = 1.0  # s between their arrivals
    seconds: float = 600.0  # bound on one round


@dataclass
class Round:
    gaps_during: list[float] = field(default_factory=list)  # ms, gaps of running streams inside the window
    gaps_quiet: list[float] = field(default_factory=list)  # ms, their gaps before the first long prompt
    long_ttft: list[float] = field(default_factory=list)  # ms, each long prompt's time to its token
    window: float = 0.0  # s


def words(count: int, seed: int) -> str:
    """`count` tokens of the word-level vocabulary (bench/lib/llm_models.make_llama_words): "w<id>" is one token."""
    return " ".join(f"w{3 + (seed * 7919 + i * 104729) % 31000}" for i in range(count))


def body(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


async def _times(client: httpx.AsyncClient, url: str, payload: dict[str, Any], first: asyncio.Event | None = None,
                 ) -> list[float]:
    """The arrival time of every streamed chunk that carries text (a token that decodes to no text, as a special one,
    sends none: its gap joins the next one's); `first` is set at the first one."""
    seen: list[float] = []
    made = 0
    async with client.stream("POST", url, json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code} {(await response.aread())[:200]!r}")
        async for line in sse_lines(response):
            data = sse_data(line)
            if data is None:
                continue
            made = (data.get("usage") or {}).get("completion_tokens", made)
            if data.get("choices") and data["choices"][0].get("text"):
                seen.append(time.perf_counter())
                if first is not None:
                    first.set()
    if made != payload["max_tokens"] or not seen:
        raise RuntimeError(f"{url}: {made} tokens streamed, expected {payload['max_tokens']}")
    return seen


async def _round(url: str, model: str, load: Load, seed: int) -> Round:
    async with httpx.AsyncClient(timeout=load.seconds) as client:
        firsts = [asyncio.Event() for _ in range(load.streams)]
        streams = [asyncio.create_task(_times(client, url, body(model, words(load.stream_prompt, seed * 100 + i),
                                                                    load.new_tokens), firsts[i]))
                   for i in range(load.streams)]
        await asyncio.gather(*(event.wait() for event in firsts))
        await asyncio.sleep(load.spacing)  # some quiet decoding first: the baseline

        async def long(index: int) -> tuple[float, float]:
            await asyncio.sleep(index * load.spacing)
            sent = time.perf_counter()
            answered = await _times(client, url, body(model, words(load.long_tokens, seed * 100 + 50 + index), 1))
            return sent, answered[0]

        longs = await asyncio.gather(*(long(i) for i in range(load.long_prompts)))
        ran = await asyncio.gather(*streams)
    if max(times[-1] for times in ran) < max(a for _, a in longs):
        raise RuntimeError(f"the streams ended before the long prompts were answered: raise new_tokens above "
                           f"{load.new_tokens}")
    return split(ran, longs)


def split(streams: list[list[float]], longs: list[tuple[float, float]]) -> Round:
    """A round from its streams' token times and its long prompts' (sent, answered) times: each gap between two
    successive tokens of a stream is "during" when it ends inside the window (first sent, last answered], "quiet"
    when it ends at or before the window's start, and is left out after it."""
    start, end = min(s for s, _ in longs), max(a for _, a in longs)
    found = Round(long_ttft=[(a - s) * 1000 for s, a in longs], window=end - start)
    for times in streams:
        for before, after in itertools.pairwise(times):
            if start < after <= end:
                found.gaps_during.append((after - before) * 1000)
            elif after <= start:
                found.gaps_quiet.append((after - before) * 1000)
    return found


def measure(url: str, model: str, load: Load, seed: int) -> Round:
    return asyncio.run(_round(url, model, load, seed))


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) of `values`, inclusive method, as bench/lib/llm_client's p99."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summary(rounds: list[Round]) -> dict[str, float]:
    during = [g for r in rounds for g in r.gaps_during]
    quiet = [g for r in rounds for g in r.gaps_quiet]
    ttft = [t for r in rounds for t in r.long_ttft]
    return {"gap_p50_ms": quantile(during, 0.5), "gap_p99_ms": quantile(during, 0.99), "gap_max_ms": max(during),
            "gaps_during": len(during), "quiet_p50_ms": quantile(quiet, 0.5), "quiet_p99_ms": quantile(quiet, 0.99),
            "long_ttft_p50_ms": quantile(ttft, 0.5), "long_ttft_max_ms": max(ttft),
            "window_s": statistics.median(r.window for r in rounds),
            "stream_tokens_in_window_per_s": len(during) / sum(r.window for r in rounds)}
