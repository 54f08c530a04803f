"""Continuous (iteration-level) batching on one engine thread, over the engine's KV slots.

Each iteration is one planned step (batch.py): plan_step() decides, under one token budget, what every slot runs
(decode tokens, verify rows of speculative drafts, prompt chunks), the engine runs it as one step
(runtimes/engines/step.py), and apply() emits what the logits give. Deciding and running are apart, so tests drive
plans directly. There are never more than max_batch sequences, and `submit` refuses a request whose prompt plus
max_tokens exceeds the context (or that breaks any other invariant), so each fits its slot. Results go back to
each request's asyncio queue. Every request that enters ends with exactly one finishing event, whatever fails:
one request's sampler or engine run ends that request alone; a shutdown ends everything left.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import numpy as np

from runtimes.engines.decoder import DecoderEngine
from runtimes.generation.batch import Batch
from runtimes.generation.draft import DraftModel
from runtimes.generation.kv_pool import KvPool
from runtimes.generation.plan import StepPlan
from runtimes.generation.prefix_cache import PrefixCache
from runtimes.generation.requests import Event, Request
from runtimes.generation.sampling import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS
from runtimes.generation.speculative import Speculation
from runtimes.metrics import BATCH_BUCKETS, Metrics
from runtimes.settings import PREFILL_CHUNK

log = logging.getLogger("mbuild.runtime")
PAUSED_POLL = 0.02  # seconds between looks at sequences paused for their readers


class SchedulerFull(Exception):
    pass


class Inadmissible(ValueError):
    """A request that could never run here; admission upstream should have refused it with a 400."""


class Scheduler:
    def __init__(self, engine: DecoderEngine, eos_ids: tuple[int, ...], max_batch: int, max_queue: int,
                 metrics: Metrics, context: int, vocab: int, prefill_chunk: int = PREFILL_CHUNK,
                 prefix_cache_bytes: int = 0, speculation: Speculation | None = None, chunked: bool = True,
                 draft: DraftModel | None = None, kv_cache_bytes: int = 0) -> None:
        """kv_cache_bytes: the KV pool's size (0: every slot's whole context)."""
        self.engine = engine
        self.max_batch, self.max_queue, self.context, self.vocab = max_batch, max_queue, context, vocab
        self.prefix = PrefixCache(prefix_cache_bytes, engine)
        self.pool = KvPool(engine, self.prefix, context, kv_cache_bytes)
        self._describe_pool(kv_cache_bytes, context)
        self.metrics = metrics
        self.waiting: collections.deque[Request] = collections.deque()
        self._ready = threading.Condition()
        speculation = speculation or Speculation()
        if (speculation.method == "draft") != (draft is not None):
            raise ValueError(f"speculation {speculation.method!r} with{'out' if draft is None else ''} a draft model")
        self.batch = Batch(engine, eos_ids, max_batch, context, prefill_chunk, self.prefix, metrics, speculation,
                           self.take_next, self.pool, chunked, draft)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        metrics.describe("batch_size", "Sequences per engine step", BATCH_BUCKETS)
        metrics.describe("time_to_first_token_seconds", "Queue plus prefill time until the first token")
        metrics.describe("time_per_output_token_seconds", "Time between a sequence's tokens")
        metrics.describe("spec_decode_drafts_total", "Verify rows run (speculative decoding)")
        metrics.describe("spec_decode_draft_tokens_total", "Draft tokens verified")
        metrics.describe("spec_decode_accepted_tokens_total", "Draft tokens accepted")
        metrics.describe("spec_decode_accepted_per_position_total", "Draft tokens accepted, by their position")
        metrics.describe("preemptions_total", "Sequences that gave their KV blocks up for an older one's (recomputed)")
        metrics.inc("preemptions_total", 0)  # read as a rate: present from the start

    def _describe_pool(self, asked: int, context: int) -> None:
        """The pool at start, in the log; a size that is capped, or too small for one whole sequence, said so."""
        pool = self.pool
        log.info("KV pool: %d tokens in %d blocks (%.0f MB)", pool.capacity_tokens, pool.total,
                 pool.capacity_bytes / (1 << 20))
        if asked > pool.capacity_bytes + pool.capacity_bytes // pool.total:
            log.info("the KV pool asked (MBUILD_KV_CACHE_MB, else the plan's batching.kv_cache_bytes) is %.1f MB; the "
                     "slots and the prefix cache can use no more than the pool's %.1f MB", asked / (1 << 20),
                     pool.capacity_bytes / (1 << 20))
        if pool.capacity_tokens < context:
            log.warning("the KV pool holds %d tokens, less than one sequence's context (%d): a sequence that fills "
                        "it alone ends early (finish_reason length); raise MBUILD_KV_CACHE_MB",
                        pool.capacity_tokens, context)

    # --- the asyncio side -----------------------------------------------------------------
    def check(self, request: Request) -> None:
        """The invariants every running request keeps; a breach is refused before it can enter."""
        prompt, params = request.prompt, request.params
        if not prompt:
            raise Inadmissible("the prompt is empty")
        if params.max_tokens < 1 or len(prompt) + params.max_tokens > self.context:
            raise Inadmissible(f"{len(prompt)} prompt tokens plus max_tokens {params.max_tokens} exceed the "
                               f"context of {self.context}")
        if len(prompt) + 1 > self.pool.capacity_tokens:
            raise Inadmissible(f"the prompt's {len(prompt)} tokens do not fit the KV cache pool of "
                               f"{self.pool.capacity_tokens} tokens; shorten it, or serve with a larger "
                               "MBUILD_KV_CACHE_MB")
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
        return len(self.batch.rows) + self._live_waiting()

    def _live_waiting(self) -> int:
        # Under the (reentrant) lock: the other thread may be adding to or taking from the deque right now.
        with self._ready:
            return sum(1 for r in self.waiting if not r.cancelled)

    def refresh_metrics(self) -> None:
        """Gauges from the state itself, so cancellations can never leave them stale."""
        pool = self.pool.describe()
        self.metrics.set("queue_depth", self._live_waiting())
        self.metrics.set("running_sequences", len(self.batch.running))
        self.metrics.set("kv_cache_sequences", len(self.batch.rows))
        self.metrics.set("kv_cache_capacity_sequences", self.max_batch)
        self.metrics.set("kv_cache_tokens", int(self.engine.lengths.sum()))
        self.metrics.set("kv_cache_capacity_tokens", pool["tokens_capacity"])
        self.metrics.set("kv_cache_free_tokens", pool["tokens_free"])
        self.metrics.set("kv_cache_blocks", pool["blocks_total"])
        self.metrics.set("kv_cache_used_blocks", pool["blocks_used"])
        self.metrics.set("kv_cache_block_tokens", pool["block_tokens"])
        self.metrics.set("kv_cache_usage_ratio", min(pool["blocks_used"] / pool["blocks_total"], 1.0))
        self.metrics.set("prefix_cache_bytes", self.prefix.bytes)
        self.metrics.set("prefix_cache_capacity_bytes", self.prefix.capacity)
        self.metrics.set("prefix_cache_entries", len(self.prefix.entries))

    # --- decisions (the engine thread calls them; tests may drive them directly) -----------
    def take_next(self, fits: Callable[[Request], bool] = lambda _: True) -> Request | None:
        """The next live waiting request, if it fits (the batch asks only when a slot is free; it fits when the KV
        pool holds its prompt): else it stays first in the queue. Cancelled ones leave with their event. It never
        waits: the engine loop waits for work itself."""
        with self._ready:
            while self.waiting:
                request = self.waiting[0]
                if request.cancelled:
                    self.waiting.popleft()
                    request.emit(Event(finish="cancelled"))
                    continue
                if not fits(request):
                    return None
                return self.waiting.popleft()
        return None

    def plan_step(self) -> StepPlan:
        return self.batch.plan_step()

    def apply(self, plan: StepPlan, results: list[np.ndarray | Exception]) -> None:
        self.batch.apply(plan, results)
        self.refresh_metrics()

    def tick(self) -> StepPlan:
        """One iteration: plan, run, apply. Returns the plan it ran."""
        plan = self.plan_step()
        if plan:
            decoding = len(plan.of("decode")) + len(plan.of("verify"))
            if decoding:
                self.metrics.observe("batch_size", decoding)
            self.apply(plan, self.engine.step([part.work for part in plan.rows]))
        else:
            self.refresh_metrics()
        return plan

    def fail_all(self, reason: str) -> None:
        """Shutdown: every running and waiting request gets its final event."""
        self.batch.fail(reason)
        with self._ready:
            left, self.waiting = list(self.waiting), collections.deque()
        for request in left:
            request.emit(Event(finish="error", error=reason))
        self.refresh_metrics()

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
                if not self.batch.rows:  # idle: wait for a request rather than spin
                    with self._ready:
                        self._ready.wait_for(lambda: self.waiting or self._stop.is_set(), timeout=0.5)
                if not self.tick() and self.batch.rows:
                    self._stop.wait(PAUSED_POLL)  # every sequence waits for its reader
            except Exception as exc:  # a bug in the decisions above: end what is running, keep serving
                log.exception("generation loop failed")
                self.batch.fail(f"internal error: {exc}")
