"""What a generation request is to the scheduler, and the events it gets back."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.sampling import SamplerState, SamplingParams

FinishReason = Literal["stop", "length", "cancelled", "error"]
_ids = itertools.count()


@dataclass
class Event:
    token: int | None = None
    finish: FinishReason | None = None
    error: str | None = None
    refused: bool = False  # the error is the request's own (its output constraint failed), not the server's
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, before the first token (echo)


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    cancelled: bool = False
    admitted: bool = False  # it joined the batch: a timeout now is a running request's, not a queue wait
    id: int = field(default_factory=lambda: next(_ids))
    enqueued: float = field(default_factory=time.perf_counter)

    def emit(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Row:
    """A request in the scheduler: its sampler, the cache it has filled, and what it has emitted."""

    request: Request
    state: SamplerState
    last: int = 0
    filled: int = 0  # prompt tokens in the slot's cache
    last_time: float = field(default_factory=time.perf_counter)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])  # the first has none
