"""The KV pool, driven through the real loop over the deterministic fake engine (tests/support/scheduler_fakes).

A pool smaller than slots x context: prompts wait in the queue until it holds them, a sequence that outgrows it
takes the youngest one's blocks (that one is recomputed), the prefix cache's entries give their blocks up first,
and nothing changes any sequence's output: the fake's next token is a function of the whole sequence, so a cache
lost or refilled wrong would show. The fake refuses to forget a position a slot still holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtimes.generation.engine_loop import EngineLoop
from runtimes.generation.prefix_cache import BLOCK
from runtimes.generation.requests import Inadmissible
from tests.support.scheduler_fakes import FakeEngine, events, expected, make, request, tokens_and_finish

BLOCK_BYTES = BLOCK * FakeEngine.bytes_per_token


def pooled(blocks: int, **options: Any) -> tuple[EngineLoop, FakeEngine]:
    engine = FakeEngine(slots=4)
    return make(engine, max_batch=4, kv_cache_bytes=blocks * BLOCK_BYTES, **options), engine


async def drive(loop: EngineLoop, requests: list[Any], limit: int = 400) -> tuple[dict[int, list[Any]], list[Any]]:
    """Ticks until idle; every step's pool use is checked against its size. Returns the events and the plans."""
    seen: dict[int, list[Any]] = {r.id: [] for r in requests}
    plans = []
    for _ in range(limit):
        plans.append(loop.tick())
        assert loop.scheduler.pool.used <= loop.scheduler.pool.total, "the pool holds more blocks than it has"
        for r in requests:
            seen[r.id] += await events(r)
        if not loop.scheduler.rows and not loop.waiting.queue:
            break
    return seen, plans


def test_prompts_wait_in_the_queue_until_the_pool_holds_them_and_every_output_is_whole() -> None:
    async def go() -> None:
        loop, _ = pooled(6, context=4 * BLOCK)  # 6 blocks where 4 slots x 4 would be 16
        prompts = [[i + 1] * 20 for i in range(4)]  # each takes 2 blocks through its end (20 + 6 tokens)
        requests = [request(p, max_tokens=6) for p in prompts]
        loop.submit(requests)
        loop.tick()
        assert len(loop.scheduler.rows) == 3 and [r.id for r in loop.waiting.queue] == [requests[3].id]
        seen, _ = await drive(loop, requests)
        for prompt, req in zip(prompts, requests, strict=True):
            assert tokens_and_finish(seen[req.id]) == (expected(prompt, 6), "length")
        found = {s.name: s.value for f in text_string_to_metric_families(loop.metrics.render()) for s in f.samples}
        assert found["mbuild_kv_cache_blocks"] == 6 and found["mbuild_kv_cache_capacity_tokens"] == 6 * BLOCK
        assert found["mbuild_kv_cache_block_tokens"] == BLOCK and found["mbuild_preemptions_total"] == 0
        assert found["vllm:kv_cache_usage_perc"] == found["mbuild_kv_cache_used_blocks"] / 6
    asyncio.run(go())


def test_a_sequence_that_outgrows_the_pool_takes_the_youngest_one_s_blocks_and_both_outputs_are_whole() -> None:
    async def go() -> None:
        loop, engine = pooled(5, context=4 * BLOCK)
        older, younger = request([3] * 10, max_tokens=40), request([4] * 10, max_tokens=40)  # 4 blocks each by the end
        loop.submit([older, younger])
        seen, plans = await drive(loop, [older, younger])
        assert tokens_and_finish(seen[older.id]) == (expected([3] * 10, 40), "length")
        assert tokens_and_finish(seen[younger.id]) == (expected([4] * 10, 40), "length")
        found = {s.name: s.value for f in text_string_to_metric_families(loop.metrics.render()) for s in f.samples}
        assert found["mbuild_preemptions_total"] >= 1 and found["vllm:num_preemptions_total"] >= 1
        # the younger one filled again from its own tokens, without logits, while the older one decoded on
        younger_slot = next(p.slot for plan in plans for p in plan.rows if p.request == younger.id)
        refills = [p for plan in plans for p in plan.of("prefill") if p.request == younger.id and p.logits == 0
                   and len(p.tokens) > 10]
        assert refills and all(p.slot == younger_slot for p in refills)
        assert (younger_slot, 0) in engine.forgotten
    asyncio.run(go())


def test_prefix_entries_give_their_blocks_up_before_a_prompt_waits() -> None:
    async def go() -> None:
        loop, engine = pooled(5, context=4 * BLOCK, prefix_cache_bytes=1 << 20)
        first = request([7] * (2 * BLOCK + 1), max_tokens=2)
        loop.submit([first])
        await drive(loop, [first])
        # the sequence's whole blocks stay in its slot as its entry, counted as that slot's pages, copied nowhere
        assert loop.scheduler.prefix.resident_tokens(0) == 2 * BLOCK and loop.scheduler.pool.prefix_blocks == 0
        assert loop.scheduler.pool.used == 3  # its pages: the prompt's 33 positions and one generated
        other = request([8] * 50, max_tokens=2)  # 4 blocks: only with the entry gone
        loop.submit([other])
        seen, _ = await drive(loop, [other])
        assert tokens_and_finish(seen[other.id]) == (expected([8] * 50, 2), "length")
        assert loop.scheduler.prefix.resident_tokens(0) == 0 and (0, 0) in engine.forgotten  # its pages handed back
    asyncio.run(go())


def test_a_prompt_the_pool_can_never_hold_is_refused_and_a_lone_sequence_that_fills_it_ends_at_its_length(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        loop, _ = pooled(3, context=8 * BLOCK)  # 48 tokens
        assert "less than one sequence's context (128): a sequence that fills it alone ends early" in caplog.text
        with pytest.raises(Inadmissible, match="MBUILD_KV_CACHE_MB"):
            loop.submit([request([1] * 48, max_tokens=4)])
        lone = request([2] * 10, max_tokens=100)
        loop.submit([lone])
        seen, _ = await drive(loop, [lone])
        made, finish = tokens_and_finish(seen[lone.id])
        assert finish == "length" and made == expected([2] * 10, len(made)) and len(made) == 3 * BLOCK - 10 + 1
    asyncio.run(go())


def test_a_pool_past_every_slot_s_context_gives_the_prefix_cache_room_of_its_own_up_to_its_cap(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", "mbuild.runtime")
    def total(asked_blocks: int, prefix_blocks: int) -> int:
        loop = make(FakeEngine(slots=4), max_batch=4, context=4 * BLOCK, kv_cache_bytes=asked_blocks * BLOCK_BYTES,
                         prefix_cache_bytes=prefix_blocks * BLOCK_BYTES)
        return loop.scheduler.pool.total

    assert total(0, 3) == 16  # the default: every slot's whole context, the prefix entries within it
    assert "can use no more" not in caplog.text
    assert total(18, 3) == 18 and total(1000, 3) == 19 and total(1000, 0) == 16  # no more than could be used
    assert "batching.kv_cache_bytes) is 0.1 MB; the slots and the prefix cache can use no more" in caplog.text
    assert total(5, 3) == 5
