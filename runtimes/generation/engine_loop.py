"""The engine thread: continuous (iteration-level) batching, one scheduled step after another, and its metrics.

Each iteration is one planned step: the scheduler (scheduler.py) plans what every slot runs under one token budget
(decode tokens, verify rows of speculative drafts, prompt chunks), the engine runs it as one step
(runtimes/engines/step.py), and the scheduler applies what comes back. Deciding and running are apart, so tests
drive plans directly. There are never more than max_batch sequences, and `submit` refuses a request whose prompt
plus max_tokens exceeds the context (or that breaks any other bound: waiting.py), so each fits its slot. Results go
back to each request's asyncio queue. Every request that enters ends with exactly one finishing event, whatever
fails: one request's sampler or engine run ends that request alone; a shutdown ends everything left.
"""

from __future__ import annotations

import logging
import threading

from runtimes.engines.contract import SlotEngine
from runtimes.generation.draft import DraftModel
from runtimes.generation.plan import StepPlan
from runtimes.generation.requests import Event, Request
from runtimes.generation.scheduler import Scheduler, SchedulerConfig
from runtimes.metrics import BATCH_BUCKETS, Metrics

log = logging.getLogger("mbuild.runtime")
PAUSED_POLL = 0.02  # seconds between looks at sequences paused for their readers


class EngineLoop:
    def __init__(self, engine: SlotEngine, config: SchedulerConfig, metrics: Metrics,
                 draft: DraftModel | None = None) -> None:
        self.engine, self.config, self.metrics = engine, config, metrics
        self.scheduler = Scheduler(engine, config, metrics, draft)
        self.waiting = self.scheduler.waiting
        self._describe_pool()
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

    def _describe_pool(self) -> None:
        """The pool at start, in the log; a size that is capped, or too small for one whole sequence, said so."""
        pool, asked, context = self.scheduler.pool, self.config.kv_cache_bytes, self.config.context
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
    def submit(self, requests: list[Request]) -> None:
        """All of them enter, or none does (Inadmissible, QueueFull): a request's prompts x n together."""
        self.waiting.submit(requests)
        self.refresh_metrics()

    @property
    def busy(self) -> int:
        return len(self.scheduler.rows) + self.waiting.live()

    def refresh_metrics(self) -> None:
        """Gauges from the state itself, so cancellations can never leave them stale."""
        scheduler = self.scheduler
        pool, prefix = scheduler.pool.describe(), scheduler.prefix
        self.metrics.set("queue_depth", self.waiting.live())
        self.metrics.set("running_sequences", len(scheduler.decoding))
        self.metrics.set("kv_cache_sequences", len(scheduler.rows))
        self.metrics.set("kv_cache_capacity_sequences", self.config.max_batch)
        self.metrics.set("kv_cache_tokens", int(self.engine.lengths.sum()))
        self.metrics.set("kv_cache_capacity_tokens", pool["tokens_capacity"])
        self.metrics.set("kv_cache_free_tokens", pool["tokens_free"])
        self.metrics.set("kv_cache_blocks", pool["blocks_total"])
        self.metrics.set("kv_cache_used_blocks", pool["blocks_used"])
        self.metrics.set("kv_cache_block_tokens", pool["block_tokens"])
        self.metrics.set("kv_cache_usage_ratio", min(pool["blocks_used"] / pool["blocks_total"], 1.0))
        self.metrics.set("prefix_cache_bytes", prefix.bytes)
        self.metrics.set("prefix_cache_capacity_bytes", prefix.capacity)
        self.metrics.set("prefix_cache_entries", len(prefix.entries))

    # --- the engine thread (tests may drive tick directly) ------------------------------------
    def tick(self) -> StepPlan:
        """One iteration: plan, run, apply. Returns the plan it ran."""
        plan = self.scheduler.plan_step()
        if plan:
            decoding = len(plan.of("decode")) + len(plan.of("verify"))
            if decoding:
                self.metrics.observe("batch_size", decoding)
            self.scheduler.apply(plan, self.engine.step([part.work for part in plan.rows]))
        self.refresh_metrics()
        return plan

    def fail_all(self, reason: str) -> None:
        """Shutdown: every running and waiting request gets its final event."""
        self.scheduler.fail(reason)
        for request in self.waiting.drain():
            request.emit(Event(finish="error", error=reason))
        self.refresh_metrics()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.waiting.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.fail_all("the server is shutting down")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.scheduler.rows:  # idle: wait for a request rather than spin
                    self.waiting.wait(0.5, self._stop.is_set)
                if not self.tick() and self.scheduler.rows:
                    self._stop.wait(PAUSED_POLL)  # every sequence waits for its reader
            except Exception as exc:  # a bug in the decisions above: end what is running, keep serving
                log.exception("generation loop failed")
                self.scheduler.fail(f"internal error: {exc}")
