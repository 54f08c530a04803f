"""A request in its slot, and the states it goes through there (vLLM's RequestStatus, llama.cpp's slot_state).

    FILLING --> RUNNING <--> PAUSED
       |  ^        |           |
       v  |        v           v
     PREEMPTED <---+-----------+        and every state but ENDED --> ENDED

FILLING: its prompt (or, after a preemption, its tokens but the last) goes into the slot's cache, a chunk a step.
RUNNING: it decodes a token, or verifies drafts, every step. PAUSED: its reader has fallen MAX_UNREAD events behind
(a client that stopped reading): it holds its slot and cache, not more, and gets no work until it reads. PREEMPTED:
it gave its KV blocks up for an older sequence (preemption.py) and keeps its slot, sampler and output; it fills
again when the pool has room. ENDED: its one finishing event is sent and its slot free. Only the methods below
change the state, and each refuses a move the diagram lacks: that is a bug in the scheduler, never a request's.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.requests import Request
from runtimes.generation.sampling import SamplerState
from runtimes.generation.speculative import RowSpeculation

MAX_UNREAD = 64  # events a reader may leave untaken before its sequence pauses


class RowStatus(enum.Enum):
    FILLING = "filling"
    RUNNING = "running"
    PAUSED = "paused"
    PREEMPTED = "preempted"
    ENDED = "ended"


MOVES: dict[RowStatus, frozenset[RowStatus]] = {
    RowStatus.FILLING: frozenset({RowStatus.RUNNING, RowStatus.PREEMPTED, RowStatus.ENDED}),
    RowStatus.RUNNING: frozenset({RowStatus.PAUSED, RowStatus.PREEMPTED, RowStatus.ENDED}),
    RowStatus.PAUSED: frozenset({RowStatus.RUNNING, RowStatus.PREEMPTED, RowStatus.ENDED}),
    RowStatus.PREEMPTED: frozenset({RowStatus.FILLING, RowStatus.ENDED}),
    RowStatus.ENDED: frozenset(),
}


class IllegalMove(RuntimeError):
    pass


@dataclass
class Row:
    """A request in its slot: its sampler, the cache it has filled, what it has emitted, and its speculation."""

    request: Request
    sampler: SamplerState
    slot: int
    speculation: RowSpeculation | None = None  # None: this sequence does not speculate
    last: int = 0
    filled: int = 0  # tokens of `source` in the slot's cache
    last_time: float = field(default_factory=time.perf_counter)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])  # the first has none
    _status: RowStatus = field(default=RowStatus.FILLING, init=False)

    @property
    def status(self) -> RowStatus:
        return self._status

    @property
    def decoding(self) -> bool:
        """Its prompt is in: it runs, or waits for its reader."""
        return self._status in (RowStatus.RUNNING, RowStatus.PAUSED)

    @property
    def tokens(self) -> list[int]:
        """The sequence so far: its prompt and what it has generated."""
        return [*self.sampler.prompt, *self.sampler.generated]

    @property
    def source(self) -> list[int]:
        """What the slot's cache holds before the sequence decodes: its prompt, or, refilling after a preemption,
        its tokens but the last (which the next decode step feeds)."""
        return self.tokens[:-1] if self.sampler.generated else self.request.prompt

    # --- the transitions ---------------------------------------------------------------------------------------
    def filled_in(self) -> None:
        """Its source is all in the cache: it decodes from the next step."""
        self._move(RowStatus.RUNNING)

    def read_or_pause(self) -> None:
        """Paused while its reader is MAX_UNREAD events behind; running again once it reads."""
        behind = self.request.unread >= MAX_UNREAD
        if behind and self._status is RowStatus.RUNNING:
            self._move(RowStatus.PAUSED)
        elif not behind and self._status is RowStatus.PAUSED:
            self._move(RowStatus.RUNNING)

    def preempt(self) -> None:
        """Its blocks are given up; it fills again from its tokens, its output so far kept."""
        self._move(RowStatus.PREEMPTED)
        self.filled, self.prompt_logprobs = 0, [None]

    def refill(self) -> None:
        """The pool holds its tokens again (preemption.py's `claimed`)."""
        self._move(RowStatus.FILLING)

    def end(self) -> None:
        self._move(RowStatus.ENDED)

    def _move(self, to: RowStatus) -> None:
        if to not in MOVES[self._status]:
            raise IllegalMove(f"request {self.request.id}: a row cannot go from {self._status.value} to {to.value}")
        self._status = to
