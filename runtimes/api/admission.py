"""The one admission path every inference route takes, whatever its API (OpenAI, KServe V2).

In order: auth (the routers' dependency), the body (bodies.py: size, time, JSON, depth, numbers, text),
the served model (readiness 503, then an unknown name 404, then the wrong task 404), the fields' bounds
(the request schemas), tokenization off the event loop, context fit for every prompt x n, then capacity
for the whole request at once (the scheduler or batcher takes all of it or none: 429; an encoder's request takes
its place before it tokenizes). Once in, a request runs under one deadline (an encoder's tokenizing included)
and stops using the engine as soon as its client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sized
from typing import TypeVar

import numpy as np
from starlette.requests import Request

from runtimes.api.errors import ApiError, bad_request, client_closed, deadline_exceeded, overloaded, queue_timeout
from runtimes.encoder_batcher import Batcher, QueueFull
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.requests import Inadmissible
from runtimes.state import EmbeddingRuntime, RerankRuntime, ServiceState
from runtimes.tokenize import INLINE_CHARS, InputTooLong

T = TypeVar("T")
U = TypeVar("U")
S = TypeVar("S", bound=Sized)
# Inputs and characters tokenized at most between two looks at the deadline and the client: tens of milliseconds.
TOKENIZE_CHUNK = 256
TOKENIZE_CHARS = 1 << 18


def served(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def check_model(state: ServiceState, name: str | None) -> None:
    names = state.served_names()
    if name is not None and name not in names:
        raise ApiError(404, f"model {name[:200]!r} is not served here; use {names[0]!r}", "model_not_found")


def _ready(state: ServiceState, name: str | None) -> None:
    if not state.health.serving:
        raise ApiError(503, f"the model is not ready ({state.health.state.value})", "model_not_ready",
                       headers={"Retry-After": "5"})
    check_model(state, name)


# What each task's model answers, for the 404 a request for another task gets.
SERVES = {"embedding": "/v1/embeddings", "rerank": "/v1/rerank, /rerank, /v1/ranking and /v1/score",
          "text-generation": "/v1/chat/completions and /v1/completions"}


def _wrong_task(state: ServiceState, wanted: str) -> ApiError:
    task = state.config.task if state.config is not None else "text-generation"
    return ApiError(404, f"this model serves {SERVES[task]} ({task}), not {wanted}", "wrong_task")


def embedding_runtime(state: ServiceState, name: str | None) -> EmbeddingRuntime:
    _ready(state, name)
    if state.embedding is None:
        raise _wrong_task(state, "embeddings")
    return state.embedding


def rerank_runtime(state: ServiceState, name: str | None) -> RerankRuntime:
    _ready(state, name)
    if state.ranking is None:
        raise _wrong_task(state, "reranking")
    return state.ranking


def generation_runtime(state: ServiceState, name: str | None) -> GenerationRuntime:
    _ready(state, name)
    if state.generation is None:
        raise _wrong_task(state, "text generation")
    return state.generation


async def off_loop(function: Callable[..., T], *args: object, size: int = INLINE_CHARS + 1) -> T:
    """Run CPU work (tokenizing, templates) in a thread unless it is small enough to do inline."""
    if size <= INLINE_CHARS:
        return function(*args)
    return await asyncio.to_thread(function, *args)


def _chunks(sizes: list[int]) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive inputs, at most TOKENIZE_CHUNK of them and TOKENIZE_CHARS characters (or one
    input) a chunk."""
    start = total = 0
    for end, size in enumerate(sizes):
        if end > start and (end - start >= TOKENIZE_CHUNK or total + size > TOKENIZE_CHARS):
            yield start, end
            start, total = end, 0
        total += size
    if start < len(sizes):
        yield start, len(sizes)


async def encoded(request: Request, batcher: Batcher[S], inputs: list[T], sizes: list[int],
                  encode: Callable[[list[T]], list[S]], too_long: Callable[[int, InputTooLong], ApiError]
                  ) -> tuple[np.ndarray, int]:
    """An encoder's inputs (sizes: their characters) tokenized and run as one job, all under the request's
    deadline: its rows, in order, and their tokens (prompt tokens). too_long(index, error) is the 400 for the
    first input over the model's limit.

    The request takes its place in the queue first, so a full queue refuses it before any work and at most
    max_queue requests hold tokenized inputs at once. It tokenizes in bounded chunks, off the event loop unless
    small, and the deadline or a client that leaves stops it between two chunks: a maximal rerank once
    tokenized for 20 s before its deadline began."""
    state = served(request)
    job = enter(batcher.reserve)

    async def work() -> tuple[np.ndarray, int]:
        try:
            seqs: list[S] = []
            for start, end in _chunks(sizes):
                try:
                    seqs += await off_loop(encode, inputs[start:end], size=sum(sizes[start:end]))
                except InputTooLong as exc:
                    raise too_long(start + exc.index, exc) from exc
            batcher.post(job, seqs)
            rows = await job.future
        finally:
            job.future.cancel()  # gives the place back unless answered
        tokens = sum(len(s) for s in seqs)
        state.metrics.inc("tokens_total", tokens, kind="prompt")
        return rows, tokens

    # Time out while tokenizing: a 504 (the server was working on it); while queued: a 503 (nothing ran yet).
    return await run_to_end(request, work(), state.settings.request_timeout, lambda: job.started or not job.queued)


def enter(submit: Callable[[], T]) -> T:
    """Reserve capacity for the whole request or refuse it whole, with the one status table."""
    try:
        return submit()
    except QueueFull as exc:
        raise overloaded() from exc
    except Inadmissible as exc:  # admission above should have caught it; the engine's own guard did
        raise bad_request(str(exc)) from exc


async def batched(request: Request, batcher: Batcher[S], seqs: list[S]) -> np.ndarray:
    """An encoder's sequences (or pairs) queued as one job and awaited under the deadline: its rows, in order.
    Their tokens count as prompt tokens."""
    state = served(request)
    job = enter(lambda: batcher.enqueue(seqs))
    rows = await run_to_end(request, job.future, state.settings.request_timeout, lambda: job.started)
    state.metrics.inc("tokens_total", sum(len(s) for s in seqs), kind="prompt")
    return rows


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects. The body is read by now, so the next ASGI message is the
    disconnect: waiting on it, rather than polling, frees an abandoned request's place at once (50 clients that
    sent maximal requests and left took the queue's 8 places for up to a poll's 0.25 s, and the next
    request got a 429)."""
    if await request.is_disconnected():  # an earlier check may have taken the message already
        return
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_to_end(request: Request, work: Awaitable[T], timeout: float, started: Callable[[], bool]) -> T:
    """Await work under the deadline, cancelling it when the client leaves or the time runs out.

    A request that never reached the engine gets 503 with Retry-After (retrying repeats nothing); one
    that was already running gets 504 without it (a retry would repeat the same work)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        if gone in done:
            raise client_closed()
        raise deadline_exceeded(timeout) if started() else queue_timeout(timeout)
    finally:
        for pending in (task, gone):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
