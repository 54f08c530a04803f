"""The step's rows within the KV pool (kv_pool.py): who fills, who grows, and who gives their blocks up.

A filling row holds a reservation for its whole prompt (a new one gets it as it enters: scheduler.py's _start); a
preempted one claims it again before it fills. A growing row takes blocks as it goes; a verify row the pool cannot
hold runs as a decode row, and a row that still finds no room takes the youngest other sequence's blocks. That one
is preempted as vLLM's scheduler does it (recompute): it keeps its slot, sampler and output, gives its blocks back,
and fills again from its tokens (Row.source), before any new prompt, when the pool has room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtimes.engines.contract import SlotEngine
from runtimes.generation.draft import DraftModel
from runtimes.generation.kv_pool import KvPool
from runtimes.generation.plan import SlotPlan
from runtimes.generation.prefix_cache import PrefixCache
from runtimes.generation.requests import Event
from runtimes.generation.rows import Row, RowStatus
from runtimes.metrics import Metrics

log = logging.getLogger("mbuild.runtime")


class Preemption:
    def __init__(self, engine: SlotEngine, pool: KvPool, prefix: PrefixCache, metrics: Metrics,
                 draft: DraftModel | None) -> None:
        self.engine, self.pool, self.prefix, self.metrics, self.draft = engine, pool, prefix, metrics, draft

    def claimed(self, row: Row) -> bool:
        """Whether the filling row holds its reservation: a preempted one claims its tokens again when they fit."""
        if row.status is not RowStatus.PREEMPTED:
            return True
        if not self.pool.make_room(row.slot, len(row.source) + 1):
            return False
        self.pool.reserve(row.slot, len(row.source) + 1)
        row.refill()
        row.filled = self.restore(row)
        return True

    def restore(self, row: Row) -> int:
        """Fill the row's slot with what the prefix cache holds of its source (nothing for a prompt whose logprobs are
        asked: they need every position's logits), keeping what the slot held before as a copy where the pool has
        room; returns the tokens it now holds."""
        room = self.pool.room_for_prefix
        if row.request.params.prompt_logprobs is not None and not row.sampler.generated:
            self.prefix.vacate(self.engine, row.slot, 0, room)
            self.engine.keep(row.slot, 0)
            return 0
        return self.prefix.restore(self.engine, row.slot, row.source, room)

    def grown(self, plans: list[SlotPlan], rows: list[Row], end: Callable[[Row, Event], None]) -> list[SlotPlan]:
        """The decode and verify rows the pool holds, oldest first: a verify row it cannot hold runs as a decode row;
        a row it cannot hold at all takes the youngest other sequence's blocks (preempted), or, youngest itself,
        waits as a preempted one; a sequence alone in a pool too small for it ends, at its length."""
        kept: list[SlotPlan] = []
        by_slot = {row.slot: row for row in rows}
        for plan in sorted(plans, key=lambda p: p.request):
            row = by_slot.get(plan.slot)
            if row is None or row.status is not RowStatus.RUNNING:
                continue  # preempted for an older row of this step
            if plan.drafts and not self.pool.make_room(plan.slot, len(plan.tokens)):
                if self.draft is not None:  # it proposed past what the target now keeps
                    self.draft.keep(plan.slot, int(self.engine.lengths[plan.slot]))
                plan = SlotPlan(plan.slot, plan.request, "decode", plan.tokens[:1], 1)
            while not self.pool.make_room(plan.slot, 1):
                others = [r for r in rows if r is not row and r.slot not in {p.slot for p in kept}
                          and r.status in (RowStatus.FILLING, RowStatus.RUNNING, RowStatus.PAUSED)]
                if not others:
                    break
                self.preempt(max(others, key=lambda r: r.request.id))
            else:  # granted: held for it, so a later row's room is not counted from the same free blocks
                self.pool.reserve(plan.slot, int(self.engine.lengths[plan.slot]) + len(plan.tokens))
                kept.append(plan)
                continue
            if any(r is not row and self.pool.held(r.slot) for r in rows):
                self.preempt(row)
            else:
                log.warning("request %d: its %d tokens fill the KV pool (%d tokens, MBUILD_KV_CACHE_MB)",
                            row.request.id, len(row.tokens), self.pool.capacity_tokens)
                end(row, Event(finish="length"))
        return kept

    def preempt(self, row: Row) -> None:
        """The row gives its blocks back and fills again later from its tokens (its output so far is kept)."""
        log.info("request %d: preempted for KV pool room (%d tokens); it is recomputed when room is made",
                 row.request.id, len(row.tokens))
        row.preempt()
        self.prefix.unpin(row.slot)
        self.engine.release(row.slot)
        self.engine.forget(row.slot, 0)
        self.pool.release(row.slot)
        if self.draft is not None:
            self.draft.release(row.slot)
        self.metrics.inc("preemptions_total")
