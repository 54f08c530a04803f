"""What a generation request is to the scheduler, the events it gets back, and why one may not enter."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.sampling import SamplingParams

FinishReason = Literal["stop", "length", "cancelled", "error"]
_ids = itertools.count()


class Inadmissible(ValueError):
    """A request that could never run here; admission upstream should have refused it with a 400."""


@dataclass
class Event:
    token: int | None = None
    finish: FinishReason | None = None
    error: str | None = None
    refused: bool = False  # the error is the request's own (its output constraint failed), not the server's
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, before the first token (echo)
    drafted: int = 0  # on the finishing event: draft tokens verified for this sequence (llama.cpp's draft_n)
    accepted: int = 0  # and of them accepted (draft_n_accepted)


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
    sent: int = 0  # events emitted (the engine thread counts) ...
    taken: int = 0  # ... and taken by the reader (the event loop counts): each counter has one writer
    held: list[Event] | None = field(default=None, repr=False)  # events of a `together` block, not posted yet

    @property
    def unread(self) -> int:
        return self.sent - self.taken

    def emit(self, event: Event) -> None:
        self.sent += 1
        if self.held is not None:
            self.held.append(event)
        else:
            self._post([event])

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The events emitted inside reach the reader at once (one wake-up of its loop), so a verify row's tokens
        become one delta and one chunk, not one each."""
        self.held = []
        try:
            yield
        finally:
            held, self.held = self.held, None
            if held:
                self._post(held)

    def _post(self, events: list[Event]) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            self.loop.call_soon_threadsafe(self._put, events)

    def _put(self, events: list[Event]) -> None:
        for event in events:
            self.events.put_nowait(event)

    async def next_event(self) -> Event:
        event = await self.events.get()
        self.taken += 1
        return event
