"""The routing benchmark's load: users chatting over their own long documents, turn after turn, on a fixed schedule;
and a plain round-robin proxy (what a Kubernetes Service does) for the arm without Dynamo.

A user's every turn is a completion whose prompt is their document (DOC_TOKENS words of the word-level vocabulary,
one token each), the conversation so far, and a new question; its answer (ANSWER_TOKENS, greedy, exactly) joins the
history. User u starts at u x START_GAP seconds and sends each next turn a pause after its answer, drawn from THINK
with the user's seeded generator (the schedule is the same in every arm). With `shared=False` every turn is a fresh
prompt of the same length instead: nothing to reuse, the control.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.lib.llm_client import streamed
from bench.lib.llm_models import VOCAB
from runtimes.dynamo.gate import streamed_back

DOC_TOKENS, QUESTION_TOKENS, ANSWER_TOKENS = 1024, 16, 32
START_GAP = 1.0  # a user arrives every second
THINK = (0.5, 2.5)  # seconds between an answer and the next turn, drawn per turn from the user's seeded generator:
# a constant pause kept users in step (answers of one length end together), so their next turns arrived at once


@dataclass(frozen=True)
class Workload:
    users: int = 16
    turns: int = 6
    shared: bool = True  # False: every prompt fresh (no prefix to reuse)

    @property
    def key(self) -> str:
        return "documents" if self.shared else "fresh"


@dataclass
class Turn:
    user: int
    turn: int
    prompt_tokens: int
    ttft: float
    latency: float
    tokens: int
    sent: float = 0.0  # seconds from the run's start

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / max(self.tokens - 1, 1)


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(f"w{int(t)}" for t in rng.integers(3, VOCAB, size=count))


async def _turn(client: httpx.AsyncClient, url: str, model: str, prompt: str) -> tuple[float, float, int, str]:
    body = {"model": model, "prompt": prompt, "max_tokens": ANSWER_TOKENS, "min_tokens": ANSWER_TOKENS,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    got = await streamed(client, url, body)
    tokens = got.usage.get("completion_tokens", 0)
    if tokens != ANSWER_TOKENS:
        raise RuntimeError(f"{url}: {tokens} tokens streamed, expected {ANSWER_TOKENS}")
    return got.ttft, got.latency, tokens, got.text


async def _user(client: httpx.AsyncClient, url: str, model: str, load: Workload, user: int, seed: int,
                start: float, out: list[Turn]) -> None:
    rng = np.random.default_rng(seed * 1000 + user)
    document, history = _words(rng, DOC_TOKENS), ""
    await asyncio.sleep(max(0.0, start + user * START_GAP - time.perf_counter()))
    for turn in range(load.turns):
        question = _words(rng, QUESTION_TOKENS)
        if load.shared:
            prompt = f"{document} {history} {question}".replace("  ", " ")
        else:
            prompt = _words(rng, DOC_TOKENS + turn * (QUESTION_TOKENS + ANSWER_TOKENS) + QUESTION_TOKENS)
        sent = time.perf_counter() - start
        ttft, latency, tokens, answer = await _turn(client, url, model, prompt)
        out.append(Turn(user, turn, len(prompt.split()), ttft, latency, tokens, sent))
        history = f"{history} {question} {answer}"
        await asyncio.sleep(rng.uniform(*THINK))


def run(url: str, model: str, load: Workload, seed: int) -> tuple[list[Turn], float]:
    """Every user's turns against `url` (a completions endpoint); the turns and the wall time."""
    async def main() -> tuple[list[Turn], float]:
        out: list[Turn] = []
        async with httpx.AsyncClient(timeout=600) as client:
            start = time.perf_counter()
            await asyncio.gather(*(_user(client, url, model, load, u, seed, start, out) for u in range(load.users)))
            return out, time.perf_counter() - start
    return asyncio.run(main())


@dataclass
class _Proxy:
    backends: list[str] = field(default_factory=lambda: os.environ["ROUTING_BACKENDS"].split(","))
    turns: itertools.cycle[str] = field(init=False)
    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=600))

    def __post_init__(self) -> None:
        self.turns = itertools.cycle(self.backends)


_PROXY = _Proxy() if "ROUTING_BACKENDS" in os.environ else None


async def _forward(request: Request) -> Response:
    """The next backend in turn, the body and the stream passed through untouched."""
    assert _PROXY is not None
    target = f"{next(_PROXY.turns)}{request.url.path}"
    upstream = await _PROXY.client.send(_PROXY.client.build_request(
        request.method, target, content=await request.body(), headers={"content-type": "application/json"}),
        stream=True)
    return streamed_back(upstream, {"content-type": upstream.headers.get("content-type", "application/json")})


app = Starlette(routes=[Route("/{path:path}", _forward, methods=["GET", "POST"])])


def summarize(turns: list[Turn], wall: float) -> dict[str, Any]:
    ttfts = sorted(t.ttft * 1000 for t in turns)
    later = sorted(t.ttft * 1000 for t in turns if t.turn > 0)
    return {"requests": len(turns), "output_tok_s": sum(t.tokens for t in turns) / wall,
            "ttft_p50_ms": float(np.percentile(ttfts, 50)), "ttft_p90_ms": float(np.percentile(ttfts, 90)),
            "later_turns_ttft_p50_ms": float(np.percentile(later, 50)) if later else None,
            "tpot_p50_ms": float(np.median([t.tpot * 1000 for t in turns])), "wall_s": wall}
