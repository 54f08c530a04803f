"""Continuous (iteration-level) batching on one engine thread.

Between decode steps, waiting requests are prefilled together and join the running batch, and
finished or cancelled ones leave it. The batch never exceeds max_batch sequences, and a request
is refused up front if its prompt plus max_tokens exceeds the context, so the KV cache is bounded
by max_batch x context. Results go back to each request's asyncio queue as they are made.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from runtimes.engines.decoder import Batch, DecoderEngine
from runtimes.generation.sampling import SamplerState, SamplingParams, next_token
from runtimes.metrics import BATCH_BUCKETS, Metrics

FinishReason = Literal["stop", "length", "cancelled", "error"]
_ids = itertools.count()


@dataclass
class Event:
    token: int | None = None
    finish: FinishReason | None = None
    error: str | None = None


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    cancelled: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    enqueued: float = field(default_factory=time.perf_counter)

    def emit(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class _Row:
    request: Request
    state: SamplerState
    last: int = 0


class SchedulerFull(Exception):
    pass


class Scheduler:
    def __init__(self, engine: DecoderEngine, eos_ids: tuple[int, ...], max_batch: int, max_queue: int,
                 metrics: Metrics) -> None:
        self.engine, self.eos_ids = engine, eos_ids
        self.max_batch, self.max_queue = max_batch, max_queue
        self.metrics = metrics
        self.waiting: queue.Queue[Request] = queue.Queue()
        self.rows: list[_Row] = []
        self.batch: Batch | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        metrics.describe("batch_size", "Sequences per engine step", BATCH_BUCKETS)
        metrics.describe("time_to_first_token_seconds", "Queue plus prefill time until the first token")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.waiting.put_nowait(None)  # type: ignore[arg-type]  # wakes the thread
        self._thread.join(timeout=10)

    @property
    def busy(self) -> int:
        return len(self.rows) + self.waiting.qsize()

    def submit(self, request: Request) -> None:
        if self.waiting.qsize() >= self.max_queue:
            raise SchedulerFull
        self.waiting.put_nowait(request)
        self.metrics.set("queue_depth", self.waiting.qsize())

    # --- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._admit()
                if self.rows:
                    self._step()
            except Exception as exc:  # an engine failure ends the affected requests, not the server
                for row in self.rows:
                    row.request.emit(Event(finish="error", error=str(exc)))
                self.rows, self.batch = [], None

    def _admit(self) -> None:
        joining: list[Request] = []
        block = not self.rows
        while len(self.rows) + len(joining) < self.max_batch:
            try:
                request = self.waiting.get(block=block and not joining, timeout=None)
            except queue.Empty:
                break
            if request is None:
                return
            if request.cancelled:
                request.emit(Event(finish="cancelled"))
                continue
            joining.append(request)
            block = False
        self.metrics.set("queue_depth", self.waiting.qsize())
        if not joining:
            return
        logits, cache = self.engine.prefill([r.prompt for r in joining])
        new_rows = [_Row(r, SamplerState.start(r.params, r.prompt)) for r in joining]
        now = time.perf_counter()
        for r in joining:
            self.metrics.observe("time_to_first_token_seconds", now - r.enqueued)
        self.batch = self.engine.merge(self.batch, cache)
        self.rows += new_rows
        self._emit_and_prune(logits, range(len(self.rows) - len(new_rows), len(self.rows)))

    def _step(self) -> None:
        assert self.batch is not None
        tokens = np.array([row.last for row in self.rows], np.int64)
        self.metrics.observe("batch_size", len(self.rows))
        logits, self.batch = self.engine.decode(self.batch, tokens)
        self._emit_and_prune(logits, range(len(self.rows)))

    def _emit_and_prune(self, logits: np.ndarray, indices: range) -> None:
        finished: set[int] = set()
        for offset, index in enumerate(indices):
            row = self.rows[index]
            request = row.request
            if request.cancelled:
                finished.add(index)
                request.emit(Event(finish="cancelled"))
                continue
            try:
                token = next_token(logits[offset], row.state, self.eos_ids)
            except Exception as exc:  # one request's sampling failure ends that request only
                finished.add(index)
                request.emit(Event(finish="error", error=f"sampling failed: {exc}"))
                continue
            row.last = token
            params = request.params
            # Sampling never picks these before min_tokens, so meeting one here always ends the sequence.
            if token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
                finished.add(index)
                request.emit(Event(finish="stop"))
                continue
            request.emit(Event(token=token))  # stop strings are matched on text by the consumer, which cancels
            if len(row.state.generated) >= params.max_tokens:
                finished.add(index)
                request.emit(Event(finish="length"))
        if finished:
            keep = [i for i in range(len(self.rows)) if i not in finished]
            self.rows = [self.rows[i] for i in keep]
            self.batch = self.engine.keep(self.batch, keep) if keep and self.batch is not None else None
        self.metrics.set("running_sequences", len(self.rows))
