"""Continuous (iteration-level) batching on one engine thread, over the engine's KV slots.

Each engine iteration prefills at most `prefill_chunk` prompt tokens (chunked prefill: a long prompt
cannot stall the running streams for its whole prefill) and then decodes one token for every running
sequence. Running sequences hold slots 0..n-1; the prompt being prefilled holds slot n and joins the
running ones when its last chunk is in; finished or cancelled ones leave between steps. A prompt first
takes what the prefix cache holds of it (runtimes/generation/prefix_cache.py). There are never more than
max_batch sequences, and `submit` refuses a request whose prompt plus max_tokens exceeds the context (or
that breaks any other invariant), so each fits its slot. Results go back to each request's asyncio queue.

Deciding (admit, step, prune, fail) is separate from running (the thread loop), so the decisions can be
driven directly. Every request that enters ends with exactly one finishing event, whatever fails: one
request's sampler or sampling failure ends that request alone; a failed prefill ends the request being
prefilled; a failed decode step ends the running batch; a shutdown ends everything left.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

from runtimes.engines.decoder import DecoderEngine
from runtimes.generation.guided import GuideError
from runtimes.generation.logprobs import token_logprob
from runtimes.generation.prefix_cache import PrefixCache
from runtimes.generation.requests import Event, FinishReason, Request, Row
from runtimes.generation.sampling import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS, SamplerState, next_token
from runtimes.metrics import BATCH_BUCKETS, Metrics
from runtimes.settings import PREFILL_CHUNK

log = logging.getLogger("mbuild.runtime")


class SchedulerFull(Exception):
    pass


class Inadmissible(ValueError):
    """A request that could never run here; admission upstream should have refused it with a 400."""


class Scheduler:
    def __init__(self, engine: DecoderEngine, eos_ids: tuple[int, ...], max_batch: int, max_queue: int,
                 metrics: Metrics, context: int, vocab: int, prefill_chunk: int = PREFILL_CHUNK,
                 prefix_cache_bytes: int = 0) -> None:
        self.engine, self.eos_ids = engine, eos_ids
        self.max_batch, self.max_queue, self.context, self.vocab = max_batch, max_queue, context, vocab
        self.prefill_chunk, self.prefix = prefill_chunk, PrefixCache(prefix_cache_bytes)
        self.metrics = metrics
        self.waiting: collections.deque[Request] = collections.deque()
        self._ready = threading.Condition()
        self.rows: list[Row] = []  # rows[i] holds slot i
        self.filling: Row | None = None  # the prompt being prefilled, in slot len(rows)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        metrics.describe("batch_size", "Sequences per engine step", BATCH_BUCKETS)
        metrics.describe("time_to_first_token_seconds", "Queue plus prefill time until the first token")
        metrics.describe("time_per_output_token_seconds", "Time between a sequence's tokens")

    # --- the asyncio side -----------------------------------------------------------------
    def check(self, request: Request) -> None:
        """The invariants every running request keeps; a breach is refused before it can enter."""
        prompt, params = request.prompt, request.params
        if not prompt:
            raise Inadmissible("the prompt is empty")
        if params.max_tokens < 1 or len(prompt) + params.max_tokens > self.context:
            raise Inadmissible(f"{len(prompt)} prompt tokens plus max_tokens {params.max_tokens} exceed the "
                               f"context of {self.context}")
        if min(prompt) < 0 or max(prompt) >= self.vocab:
            raise Inadmissible(f"prompt token ids must lie in 0..{self.vocab - 1}")
        if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS or len(params.logit_bias) > MAX_LOGIT_BIAS:
            raise Inadmissible(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids and {MAX_LOGIT_BIAS} logit_bias entries")
        if any(not 0 <= token < self.vocab for token, _ in params.logit_bias):
            raise Inadmissible(f"logit_bias token ids must lie in 0..{self.vocab - 1}")

    def submit(self, requests: list[Request]) -> None:
        """All of them enter, or none does (Inadmissible, SchedulerFull): a request's prompts x n together."""
        for request in requests:
            self.check(request)
        with self._ready:
            if self._live_waiting() + len(requests) > self.max_queue:
                raise SchedulerFull
            self.waiting.extend(requests)
            self._ready.notify()
        self.refresh_metrics()

    @property
    def busy(self) -> int:
        return len(self.rows) + (self.filling is not None) + self._live_waiting()

    def _live_waiting(self) -> int:
        # Under the (reentrant) lock: the other thread may be adding to or taking from the deque right now.
        with self._ready:
            return sum(1 for r in self.waiting if not r.cancelled)

    def refresh_metrics(self) -> None:
        """Gauges from the state itself, so cancellations can never leave them stale."""
        held = int(self.engine.lengths.sum())
        capacity = self.max_batch * self.context
        self.metrics.set("queue_depth", self._live_waiting())
        self.metrics.set("running_sequences", len(self.rows))
        self.metrics.set("kv_cache_sequences", len(self.rows) + (self.filling is not None))
        self.metrics.set("kv_cache_capacity_sequences", self.max_batch)
        self.metrics.set("kv_cache_tokens", held)
        self.metrics.set("kv_cache_capacity_tokens", capacity)
        self.metrics.set("kv_cache_usage_ratio", held / capacity)
        self.metrics.set("prefix_cache_bytes", self.prefix.bytes)
        self.metrics.set("prefix_cache_capacity_bytes", self.prefix.capacity)
        self.metrics.set("prefix_cache_entries", len(self.prefix.entries))

    # --- decisions (the engine thread calls them; tests may drive them directly) -----------
    def take_next(self, block: bool) -> Request | None:
        """The next live waiting request, if a slot is free; cancelled ones leave with their event."""
        with self._ready:
            if block:
                self._ready.wait_for(lambda: self.waiting or self._stop.is_set(), timeout=0.5)
            while self.waiting and len(self.rows) < self.max_batch:
                request = self.waiting.popleft()
                if not request.cancelled:
                    return request
                request.emit(Event(finish="cancelled"))
        return None

    def _start_filling(self, block: bool) -> bool:
        """Put the next request in the free slot after the running ones, with what the prefix cache has."""
        while self.filling is None:
            request = self.take_next(block)
            if request is None:
                return False
            try:  # one request's bad sampler settings end that request alone
                row = Row(request, SamplerState.start(request.params, request.prompt))
            except Exception as exc:
                log.error("request %d: sampler setup failed: %s", request.id, exc)
                request.emit(Event(finish="error", error=f"sampler setup failed: {exc}"))
                continue
            # Prompt logprobs need every prompt position's logits: such a prompt takes nothing from the cache.
            if request.params.prompt_logprobs is None:
                row.filled = self.prefix.restore(self.engine, len(self.rows), request.prompt)
            self.prefix.count(self.metrics, len(request.prompt), row.filled)
            self.filling = row
        return True

    def admit(self, block: bool = False) -> None:
        """Prefill up to prefill_chunk prompt tokens; prompts whose last chunk is in join the running rows."""
        budget = self.prefill_chunk
        while budget > 0 and self._start_filling(block and not self.rows):
            row = self.filling
            assert row is not None
            slot, prompt = len(self.rows), row.request.prompt
            if row.request.cancelled:
                self._end_filling(Event(finish="cancelled"))
                continue
            # A prompt whose logprobs are asked for goes one token a step (the engine gives the last position's
            # logits), each step counted as 16 tokens of the budget so the running rows still decode.
            each = row.request.params.prompt_logprobs
            piece = prompt[row.filled:row.filled + (budget if each is None else 1)]
            try:
                logits = self.engine.run(slot, np.array([piece], np.int64))
            except Exception as exc:  # the running rows are untouched: only this prompt fails
                log.exception("prefill of request %d failed", row.request.id)
                self._end_filling(Event(finish="error", error=f"prefill failed: {exc}"))
                continue
            row.filled += len(piece)
            budget -= len(piece) if each is None else 16
            if each is not None and row.filled < len(prompt):
                row.prompt_logprobs.append(token_logprob(logits[0], prompt[row.filled], each))
            if row.filled == len(prompt):
                self._join(row, logits)
        self.refresh_metrics()

    def _end_filling(self, event: Event) -> None:
        assert self.filling is not None
        self.filling.request.emit(event)
        self.engine.release(len(self.rows))
        self.filling = None

    def _join(self, row: Row, logits: np.ndarray) -> None:
        self.prefix.store(self.engine, len(self.rows), row.request.prompt)
        self.filling = None
        row.request.admitted = True
        self.metrics.observe("time_to_first_token_seconds", time.perf_counter() - row.request.enqueued)
        self.metrics.inc("tokens_total", len(row.request.prompt), kind="prompt")
        if row.request.params.prompt_logprobs is not None:
            row.request.emit(Event(prompt_logprobs=tuple(row.prompt_logprobs)))
        self.rows.append(row)
        self._emit_and_prune(logits, range(len(self.rows) - 1, len(self.rows)))

    def step(self) -> None:
        if not self.rows:
            return
        tokens = np.array([[row.last] for row in self.rows], np.int64)
        self.metrics.observe("batch_size", len(self.rows))
        try:
            logits = self.engine.run(0, tokens)
        except Exception as exc:  # the step's cache writes are suspect: every running row ends
            log.exception("decode step failed for %d sequences", len(self.rows))
            self.fail_running(f"decode failed: {exc}")
            return
        self._emit_and_prune(logits, range(len(self.rows)))

    def fail_running(self, reason: str) -> None:
        for row in self.rows:
            row.request.emit(Event(finish="error", error=reason))
        self._remove(set(range(len(self.rows))))
        self.refresh_metrics()

    def fail_all(self, reason: str) -> None:
        """Shutdown: every running and waiting request gets its final event."""
        self.fail_running(reason)
        if self.filling is not None:
            self._end_filling(Event(finish="error", error=reason))
        with self._ready:
            left, self.waiting = list(self.waiting), collections.deque()
        for request in left:
            request.emit(Event(finish="error", error=reason))
        self.refresh_metrics()

    def _remove(self, finished: set[int]) -> None:
        """Free the finished rows' slots, moving the last running ones into the holes (slots stay 0..n-1)."""
        filling_slot = len(self.rows)
        for index in sorted(finished, reverse=True):
            last = len(self.rows) - 1
            self.engine.release(index)
            if index != last:
                self.engine.move(last, index)
                self.rows[index] = self.rows[last]
            self.rows.pop()
        if self.filling is not None:
            self.engine.move(filling_slot, len(self.rows))

    def _emit_and_prune(self, logits: np.ndarray, indices: range) -> None:
        finished: set[int] = set()
        now = time.perf_counter()
        for offset, index in enumerate(indices):
            if self._advance(self.rows[index], logits[offset], now) is not None:
                finished.add(index)
        if finished:
            self._remove(finished)
        self.refresh_metrics()

    def _advance(self, row: Row, logits: np.ndarray, now: float) -> FinishReason | None:
        """One row's next token and event; the reason it finished, if it did."""
        request, params = row.request, row.request.params
        if request.cancelled:
            request.emit(Event(finish="cancelled"))
            return "cancelled"
        try:
            token = next_token(logits, row.state, self.eos_ids)
        except Exception as exc:  # one request's sampling failure ends that request only
            log.error("request %d: sampling failed: %s", request.id, exc)
            request.emit(Event(finish="error", error=f"sampling failed: {exc}", refused=isinstance(exc, GuideError)))
            return "error"
        row.last = token
        self.metrics.inc("tokens_total", 1, kind="completion")
        if row.state.generated[1:]:
            self.metrics.observe("time_per_output_token_seconds", now - row.last_time)
        row.last_time = now
        # Sampling never picks these before min_tokens, so meeting one here always ends the sequence.
        if token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
            request.emit(Event(finish="stop"))
            return "stop"
        chosen = None if params.logprobs is None else token_logprob(logits, token, params.logprobs)
        request.emit(Event(token=token, logprob=chosen))  # stop strings are matched on text by the consumer
        ended: FinishReason | None = "stop" if row.state.complete else None  # the grammar's output is whole
        ended = ended or ("length" if len(row.state.generated) >= params.max_tokens else None)
        if ended:
            request.emit(Event(finish=ended))
        return ended

    # --- running --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.fail_all("the server is shutting down")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.admit(block=not self.rows)
                self.step()
            except Exception as exc:  # a bug in the decisions above: end what is running, keep serving
                log.exception("generation loop failed")
                self.fail_running(f"internal error: {exc}")
