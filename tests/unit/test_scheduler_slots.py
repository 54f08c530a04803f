"""Slots, chunked prefill and the prefix cache, driven through the real scheduler over the fake slot engine.

Every test compares outputs with what each prompt gives alone (`expected`): a cache moved to the wrong slot,
a prefix restored wrong or a chunk lost changes a sequence's tokens.
"""

from __future__ import annotations

import asyncio

from runtimes.generation.prefix_cache import BLOCK
from tests.support.scheduler_fakes import FakeEngine, events, expected, make, request, run_until_idle, tokens_and_finish


def test_a_long_prompt_is_prefilled_in_chunks_while_running_streams_keep_decoding() -> None:
    async def go() -> None:
        engine = FakeEngine()
        scheduler = make(engine, prefill_chunk=16)
        running = request([1, 2], max_tokens=20)
        scheduler.submit([running])
        scheduler.admit()
        first_token = await events(running)
        long_prompt = [3] * 50
        joining = request(long_prompt, max_tokens=3)
        scheduler.submit([joining])
        streamed_during_prefill = 0
        for _ in range(4):  # 50 tokens in chunks of 16: four engine iterations
            scheduler.admit()
            scheduler.step()
            streamed_during_prefill += sum(e.token is not None for e in await events(running))
        assert engine.prefilled[-4:] == [16, 16, 16, 2]
        assert streamed_during_prefill == 4  # one token per iteration, none stalled by the long prefill
        seen = await run_until_idle(scheduler, [running, joining])
        assert len(first_token) == 1 and first_token[0].token is not None
        assert tokens_and_finish(seen[joining.id]) == (expected(long_prompt, 3), "length")
    asyncio.run(go())


def test_a_shared_prefix_is_restored_instead_of_prefilled_and_the_output_is_unchanged() -> None:
    async def go() -> None:
        engine = FakeEngine()
        scheduler = make(engine, prefix_cache_bytes=1 << 20, context=4 * BLOCK)
        system = [5] * (2 * BLOCK + 10)
        first, second = request([*system, 1, 2], max_tokens=4), request([*system, 7], max_tokens=4)
        scheduler.submit([first])
        seen = await run_until_idle(scheduler, [first])
        scheduler.submit([second])
        seen.update(await run_until_idle(scheduler, [second]))
        assert engine.prefilled[-1] == len(second.prompt) - 2 * BLOCK  # only the part past the cached blocks
        assert tokens_and_finish(seen[first.id]) == (expected(first.prompt, 4), "length")
        assert tokens_and_finish(seen[second.id]) == (expected(second.prompt, 4), "length")
        metrics = scheduler.metrics.render()
        assert "mbuild_prefix_cache_hits_total 1" in metrics
        assert f"mbuild_prefix_cache_hit_tokens_total {2 * BLOCK}" in metrics
        rate = 2 * BLOCK / (len(first.prompt) + len(second.prompt))
        assert f"mbuild_prefix_cache_hit_rate {rate:g}" in metrics
    asyncio.run(go())


def test_the_prefix_cache_stays_within_its_bytes_and_drops_the_least_recently_used() -> None:
    async def go() -> None:
        engine = FakeEngine()
        one_entry = BLOCK * engine.bytes_per_token
        scheduler = make(engine, prefix_cache_bytes=2 * one_entry, context=4 * BLOCK)
        prompts = [[t] * (BLOCK + 1) for t in (1, 2, 3)]
        for prompt in prompts:
            req = request(prompt, max_tokens=1)
            scheduler.submit([req])
            await run_until_idle(scheduler, [req])
        assert scheduler.prefix.bytes <= 2 * one_entry
        assert scheduler.prefix.lookup(prompts[0])[1] == 0  # the oldest went
        assert scheduler.prefix.lookup(prompts[2])[1] == BLOCK
    asyncio.run(go())


def test_finishing_rows_move_slots_without_mixing_caches_even_mid_prefill() -> None:
    async def go() -> None:
        scheduler = make(FakeEngine(), max_batch=4, prefill_chunk=8)
        short = [request([i + 1], max_tokens=2 + i) for i in range(3)]  # end one after another
        scheduler.submit(short)
        for _ in range(3):
            scheduler.admit()
        late = request([9] * 30, max_tokens=6)  # prefilled in chunks while the others finish and move
        scheduler.submit([late])
        seen = await run_until_idle(scheduler, [*short, late])
        for r in [*short, late]:
            assert tokens_and_finish(seen[r.id]) == (expected(r.prompt, r.params.max_tokens), "length")
        assert int(scheduler.engine.lengths.sum()) == 0  # every slot was freed
    asyncio.run(go())
