"""Slots, chunked prefill and the prefix cache, driven through the real scheduler's plans over the fake engine.

Every test compares outputs with what each prompt gives alone (`expected`): a cache in the wrong slot, a prefix
restored wrong or a chunk lost changes a sequence's tokens.
"""

from __future__ import annotations

import asyncio

from runtimes.generation.prefix_cache import BLOCK
from runtimes.generation.rows import MAX_UNREAD
from tests.support.scheduler_fakes import FakeEngine, events, expected, make, request, run_until_idle, tokens_and_finish


def test_a_long_prompt_is_prefilled_in_chunks_under_the_budget_while_running_streams_keep_decoding() -> None:
    async def go() -> None:
        loop = make(FakeEngine(), prefill_chunk=16)
        running = request([1, 2], max_tokens=20)
        loop.submit([running])
        assert loop.tick().of("prefill")[0].tokens == (1, 2)
        long_prompt = [3] * 50
        joining = request(long_prompt, max_tokens=3)
        loop.submit([joining])
        plans = [loop.tick() for _ in range(4)]  # 50 tokens beside one decode token a step: 15 + 15 + 15 + 5
        for plan in plans:
            assert [part.request for part in plan.of("decode")] == [running.id]  # never stalled by the prompt
            assert plan.tokens <= 16
        chunks = [part.tokens for plan in plans for part in plan.of("prefill")]
        assert [len(c) for c in chunks] == [15, 15, 15, 5] and sum(chunks, ()) == tuple(long_prompt)
        assert [part.logits for plan in plans for part in plan.of("prefill")] == [0, 0, 0, 1]  # the last gives one
        seen = await run_until_idle(loop, [running, joining])
        assert tokens_and_finish(seen[running.id]) == (expected([1, 2], 20), "length")
        assert tokens_and_finish(seen[joining.id]) == (expected(long_prompt, 3), "length")
    asyncio.run(go())


def test_a_shared_prefix_is_restored_instead_of_prefilled_and_the_output_is_unchanged() -> None:
    async def go() -> None:
        engine = FakeEngine()
        loop = make(engine, prefix_cache_bytes=1 << 20, context=4 * BLOCK)
        system = [5] * (2 * BLOCK + 10)
        first, second = request([*system, 1, 2], max_tokens=4), request([*system, 7], max_tokens=4)
        loop.submit([first])
        seen = await run_until_idle(loop, [first])
        loop.submit([second])
        seen.update(await run_until_idle(loop, [second]))
        prefilled = [w.tokens for w in engine.works if len(w.tokens) > 1]
        assert prefilled[-1] == tuple(second.prompt[2 * BLOCK:])  # only the part past the cached blocks
        assert tokens_and_finish(seen[first.id]) == (expected(first.prompt, 4), "length")
        assert tokens_and_finish(seen[second.id]) == (expected(second.prompt, 4), "length")
        metrics = loop.metrics.render()
        assert "mbuild_prefix_cache_hits_total 1" in metrics
        assert f"mbuild_prefix_cache_hit_tokens_total {2 * BLOCK}" in metrics
        rate = 2 * BLOCK / (len(first.prompt) + len(second.prompt))
        assert f"mbuild_prefix_cache_hit_rate {rate:g}" in metrics
    asyncio.run(go())


def test_a_conversation_s_next_turn_goes_on_in_the_slot_its_last_turn_left_copying_nothing() -> None:
    """Turn 2's prompt is turn 1's prompt, its answer and a question: it is placed in turn 1's slot (not the lowest
    free one) and holds turn 1's positions, answer included, as they were; the prefix cache copied nothing."""
    async def go() -> None:
        engine = FakeEngine()
        loop = make(engine, max_batch=4, prefix_cache_bytes=1 << 20, context=8 * BLOCK)
        other = request([9] * 5, max_tokens=2 * BLOCK)  # keeps slot 0 busy: turn 1 goes to slot 1
        loop.submit([other])
        loop.tick()
        turn1 = request([4] * (2 * BLOCK + 3), max_tokens=BLOCK)
        loop.submit([turn1])
        seen = await run_until_idle(loop, [turn1])
        answer, _ = tokens_and_finish(seen[turn1.id])
        assert loop.scheduler.prefix.resident_tokens(1) == 3 * BLOCK  # its prompt and answer, whole blocks
        turn2 = request([*turn1.prompt, *answer, 6, 6, 6], max_tokens=4)
        loop.submit([turn2])
        seen.update(await run_until_idle(loop, [turn2, other]))
        assert tokens_and_finish(seen[turn2.id]) == (expected(turn2.prompt, 4), "length")
        assert tokens_and_finish(seen[other.id]) == (expected(other.prompt, 2 * BLOCK), "length")
        assert engine.copies == [("keep", 1, 3 * BLOCK)] and loop.scheduler.prefix.bytes == 0
        assert [w.tokens for w in engine.works if len(w.tokens) > 1][-1] == tuple(turn2.prompt[3 * BLOCK:])
    asyncio.run(go())


def test_a_free_slot_s_prefix_survives_the_runs_that_pad_it() -> None:
    """Slots 0 and 2 decode in one run, which pads the free slot between them: the padding goes past the prefix
    that slot keeps, so the conversation that left it goes on there with its positions intact."""
    async def go() -> None:
        engine = FakeEngine()
        loop = make(engine, max_batch=3, prefix_cache_bytes=1 << 20, context=8 * BLOCK)
        outer = [request([1, 2], max_tokens=3 * BLOCK), None, request([3, 4], max_tokens=3 * BLOCK)]
        middle = request([5] * (2 * BLOCK + 3), max_tokens=4)
        loop.submit([outer[0], middle, outer[2]])  # type: ignore[list-item]
        for _ in range(8):
            loop.tick()
        await run_until_idle(loop, [middle], limit=1)
        assert loop.scheduler.slots[1] is None and loop.scheduler.prefix.resident_tokens(1) == 2 * BLOCK
        padded = [part for part in [loop.tick() for _ in range(4)] if len(part.of("decode")) == 2]
        assert padded and engine.buffers[1][:2 * BLOCK] == [5] * (2 * BLOCK)  # the run spanned it; nothing lost
        answer = expected(middle.prompt, 4)
        turn2 = request([*middle.prompt, *answer, 7], max_tokens=4)
        loop.submit([turn2])
        seen = await run_until_idle(loop, [turn2, outer[0], outer[2]])  # type: ignore[list-item]
        assert tokens_and_finish(seen[turn2.id]) == (expected(turn2.prompt, 4), "length")
        assert ("keep", 1, 2 * BLOCK) in engine.copies
    asyncio.run(go())


def test_a_prompt_sharing_a_running_sequence_s_prefix_copies_it_from_that_slot() -> None:
    async def go() -> None:
        engine = FakeEngine()
        loop = make(engine, max_batch=4, prefix_cache_bytes=1 << 20, context=8 * BLOCK)
        system = [5] * (2 * BLOCK)
        first = request([*system, 1], max_tokens=3 * BLOCK)
        loop.submit([first])
        for _ in range(3):
            loop.tick()  # its prompt is in: pinned where it runs
        second = request([*system, 2, 3], max_tokens=4)
        loop.submit([second])
        seen = await run_until_idle(loop, [first, second])
        assert ("copy", 1, 2 * BLOCK) in engine.copies
        for req in (first, second):
            assert tokens_and_finish(seen[req.id]) == (expected(req.prompt, req.params.max_tokens), "length")
    asyncio.run(go())


def test_a_re_let_slot_s_prefix_becomes_a_copy_within_the_byte_bound_the_least_recently_used_going_first() -> None:
    """One slot: each prompt takes it from the last one, whose prefix (resident in it) is kept as a copy; copies stay
    within MBUILD_PREFIX_CACHE_MB's bytes, the oldest going first."""
    async def go() -> None:
        engine = FakeEngine()
        one_entry = BLOCK * engine.bytes_per_token
        loop = make(engine, max_batch=1, prefix_cache_bytes=one_entry, context=4 * BLOCK)
        prompts = [[t] * (BLOCK + 1) for t in (1, 2, 3)]
        for prompt in prompts:
            req = request(prompt, max_tokens=1)
            loop.submit([req])
            await run_until_idle(loop, [req])
        assert loop.scheduler.prefix.bytes <= one_entry
        assert loop.scheduler.prefix.lookup(prompts[0])[1] == 0  # the oldest went
        second, _ = loop.scheduler.prefix.lookup(prompts[1])
        third, _ = loop.scheduler.prefix.lookup(prompts[2])
        assert second is not None and second.slot is None and len(second.blocks[0]) == BLOCK  # a copy
        assert third is not None and third.slot == 0 and not third.blocks  # in its slot, where it was left
    asyncio.run(go())


def test_slots_keep_their_ids_and_a_freed_one_is_refilled_without_moving_or_mixing_caches() -> None:
    async def go() -> None:
        loop = make(FakeEngine(), max_batch=4, prefill_chunk=8)
        short = [request([i + 1], max_tokens=2 + i) for i in range(3)]  # end one after another
        loop.submit(short)
        loop.tick()
        assert [row.slot for row in loop.scheduler.rows] == [0, 1, 2]
        late = request([9] * 30, max_tokens=6)  # prefilled in chunks while the others finish
        loop.submit([late])
        slots_of_late = set()
        seen: dict[int, list] = {r.id: [] for r in [*short, late]}
        while loop.scheduler.rows or loop.waiting.queue:
            plan = loop.tick()
            slots_of_late |= {part.slot for part in plan.rows if part.request == late.id}
            for r in [*short, late]:
                seen[r.id] += await events(r)
        assert slots_of_late == {3}  # the one free slot, kept to the end
        for r in [*short, late]:
            assert tokens_and_finish(seen[r.id]) == (expected(r.prompt, r.params.max_tokens), "length")
        assert int(loop.engine.lengths.sum()) == 0  # every slot was freed
    asyncio.run(go())


def test_streams_that_never_read_pause_in_their_slots_and_resume_when_read() -> None:
    """Twelve readers that take nothing: each sequence stops after MAX_UNREAD events waiting (the memory a paused
    stream holds is that many small events, not max_tokens of them), keeps its slot, and decodes on, to the same
    tokens, once read. The plan gives paused rows no work."""
    async def go() -> None:
        loop = make(FakeEngine(), max_batch=12, context=1024)
        idle = [request([i + 1, 2], max_tokens=500) for i in range(12)]
        loop.submit(idle)
        for _ in range(3 * MAX_UNREAD):
            plan = loop.tick()
        await asyncio.sleep(0)
        assert not plan and all(r.unread == MAX_UNREAD for r in idle)  # nothing runs; none holds more
        assert [row.slot for row in loop.scheduler.rows] == list(range(12))  # and each keeps its slot
        seen = {r.id: await events(r) for r in idle}
        assert len(loop.tick().of("decode")) == 12  # read: all twelve decode again
        while loop.scheduler.rows:
            loop.tick()
            for r in idle:
                seen[r.id] += await events(r)
        for r in idle:
            assert tokens_and_finish(seen[r.id]) == (expected(r.prompt, 500), "length")
    asyncio.run(go())


def test_an_engine_that_takes_no_chunks_gets_every_prompt_whole() -> None:
    """A grown-cache (TensorRT) engine: a prompt goes in one step or waits in its slot for one, never cut."""
    async def go() -> None:
        loop = make(FakeEngine(), max_batch=4, prefill_chunk=16, chunked=False)
        running = request([1, 2], max_tokens=12)
        loop.submit([running])
        loop.tick()
        joining = [request([3] * 30, max_tokens=3), request([4] * 20, max_tokens=3)]
        loop.submit(joining)
        plans = [loop.tick() for _ in range(3)]
        chunks = [part.tokens for plan in plans for part in plan.of("prefill")]
        assert sorted(len(c) for c in chunks) == [20, 30]  # whole, past the budget, one a step beside the decode
        seen = await run_until_idle(loop, [running, *joining])
        for r in [running, *joining]:
            assert tokens_and_finish(seen[r.id]) == (expected(r.prompt, r.params.max_tokens), "length")
    asyncio.run(go())
