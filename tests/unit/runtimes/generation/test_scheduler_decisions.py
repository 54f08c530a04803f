"""The scheduler's decisions, driven directly (no engine thread) over a deterministic fake engine.

The fake stands in for the ONNX graph only: its next token depends on the row's prompt and position alone,
so a sequence's output must not change with whatever else shares the batch. Every request must end with
exactly one finishing event, whatever fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from runtimes.encoder_batcher import QueueFull
from runtimes.generation import scheduler as scheduler_module
from runtimes.generation.requests import Inadmissible, Request
from runtimes.generation.sampling import SamplingParams
from tests.support.scheduler_fakes import (
    VOCAB,
    FakeEngine,
    events,
    expected,
    make,
    request,
    run_until_idle,
    tokens_and_finish,
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_request_joining_mid_decode_changes_no_one_s_output() -> None:
    async def go() -> None:
        loop = make()
        first = request([1, 2, 3], max_tokens=8)
        loop.submit([first])
        for _ in range(3):
            loop.tick()
        second = request([9, 9], max_tokens=5)
        loop.submit([second])
        seen = await run_until_idle(loop, [first, second])
        got_first = tokens_and_finish(seen[first.id])
        got_second = tokens_and_finish(seen[second.id])
        assert got_first == (expected([1, 2, 3], 8), "length")
        assert got_second == (expected([9, 9], 5), "length")
    run(go())


def test_a_cancelled_request_leaves_at_the_next_step_and_the_other_goes_on() -> None:
    async def go() -> None:
        loop = make()
        leaving, staying = request([4], max_tokens=20), request([5], max_tokens=6)
        loop.submit([leaving, staying])
        loop.tick()
        leaving.cancelled = True
        plan = loop.tick()
        assert [part.request for part in plan.rows] == [staying.id]  # the cancelled one is not planned
        assert [row.request.id for row in loop.scheduler.rows] == [staying.id]
        seen = await run_until_idle(loop, [leaving, staying])
        assert tokens_and_finish(seen[leaving.id])[1] == "cancelled"
        assert tokens_and_finish(seen[staying.id]) == (expected([5], 6), "length")
        waiting = request([6])
        loop.submit([waiting])
        waiting.cancelled = True  # a client that left while queued never reaches the engine
        assert loop.busy == 0
        seen = await run_until_idle(loop, [waiting])
        assert tokens_and_finish(seen[waiting.id]) == ([], "cancelled")
    run(go())


def test_a_stop_token_ends_the_sequence_with_stop() -> None:
    async def go() -> None:
        loop = make()
        want = expected([2, 2], 6)
        stopping = request([2, 2], max_tokens=6, stop_token_ids=frozenset({want[2]}))
        loop.submit([stopping])
        seen = await run_until_idle(loop, [stopping])
        assert tokens_and_finish(seen[stopping.id]) == (want[:2], "stop")
    run(go())


def test_an_engine_error_ends_the_affected_requests_with_events_and_the_rest_still_run() -> None:
    async def go() -> None:
        engine = FakeEngine()
        loop = make(engine)
        running = [request([1], max_tokens=10), request([2], max_tokens=10)]
        loop.submit(running)
        loop.tick()
        engine.fail_decode_at = engine.steps + 1
        engine.fail_prefill = lambda tokens: tokens == [13]
        joining = [request([13])]  # its prefill fails
        loop.submit(joining)
        later = request([3], max_tokens=4)
        seen = await run_until_idle(loop, running + joining)
        for r in running + joining:  # every one ended, with an error and nothing after it
            assert tokens_and_finish(seen[r.id])[1] == "error"
            assert seen[r.id][-1].error
        loop.submit([later])
        seen = await run_until_idle(loop, [later])
        assert tokens_and_finish(seen[later.id]) == (expected([3], 4), "length")
    run(go())


def test_shutdown_with_requests_in_flight_ends_each_one_once() -> None:
    async def go() -> None:
        loop = make(max_batch=2)
        requests = [request([i + 1], max_tokens=30) for i in range(5)]
        loop.submit(requests)
        loop.tick()
        loop.tick()
        loop.stop()  # the thread never started: stop still ends everything
        for r in requests:
            assert tokens_and_finish(await events(r))[1] == "error"
        assert loop.busy == 0
    run(go())


def test_submit_keeps_its_invariants_and_admits_all_or_nothing() -> None:
    async def go() -> None:
        loop = make(max_queue=3)
        for bad in (request([]), request([1] * 60, max_tokens=10), request([VOCAB]), request([-1]),
                    request([1], stop_token_ids=frozenset(range(65)))):
            with pytest.raises(Inadmissible):
                loop.submit([bad])
        with pytest.raises(QueueFull):
            loop.submit([request([1]) for _ in range(4)])
        assert not loop.waiting.queue  # nothing of the refused request stayed queued
        loop.submit([request([1]) for _ in range(3)])
        assert loop.busy == 3
    run(go())


@contextmanager
def failing_sampler(poisoned: int, at_token: int) -> Iterator[None]:
    """Sampling fails for the request whose prompt starts with `poisoned`, at its at_token-th token."""
    real = scheduler_module.next_token

    def flaky(logits: np.ndarray, state: Any, eos: tuple[int, ...]) -> int:
        if state.prompt[0] == poisoned and len(state.generated) == at_token:
            raise ValueError("poisoned sampler")
        return real(logits, state, eos)

    scheduler_module.next_token = flaky  # type: ignore[assignment]
    try:
        yield
    finally:
        scheduler_module.next_token = real


def test_a_failing_request_leaves_every_other_output_identical() -> None:
    prompts = [[3, 1], [4, 1, 5], [9, 2, 6, 5]]

    async def outputs(with_failing: bool) -> dict[int, tuple[list[int], str | None]]:
        loop = make(max_batch=8)
        aio = asyncio.get_running_loop()
        innocents = [Request(p, SamplingParams(max_tokens=12, temperature=0.9, top_k=5, seed=i), aio, asyncio.Queue())
                     for i, p in enumerate(prompts)]
        extra = [request([42, 1], max_tokens=12)] if with_failing else []
        loop.submit(innocents[:2] + extra + innocents[2:])
        with failing_sampler(42, at_token=3):
            seen = await run_until_idle(loop, innocents + extra)
        if extra:
            assert tokens_and_finish(seen[extra[0].id]) == (expected([42, 1], 3), "error")
        return {i: tokens_and_finish(seen[r.id]) for i, r in enumerate(innocents)}

    alone, beside = run(outputs(False)), run(outputs(True))
    assert alone == beside and all(finish == "length" for _, finish in alone.values())


def test_the_queue_can_be_counted_while_the_engine_thread_takes_from_it() -> None:
    """busy and the gauges count the waiting queue from the event loop while the engine thread pops it."""
    async def go() -> None:
        loop = make(max_batch=1, max_queue=10_000)
        failures: list[BaseException] = []
        stop = threading.Event()

        def take() -> None:
            while not stop.is_set():
                try:
                    loop.waiting.take()
                except BaseException as exc:  # a deque mutated during iteration would land here
                    failures.append(exc)

        taker = threading.Thread(target=take)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often, as a loaded server does
        taker.start()
        try:
            deadline = time.monotonic() + 1.0
            batch = [request([1]) for _ in range(500)]
            while time.monotonic() < deadline:  # a long queue, so counting it spans thread switches
                with contextlib.suppress(QueueFull):
                    loop.submit(batch)
                _ = loop.busy
                loop.refresh_metrics()
        finally:
            stop.set()
            taker.join()
            sys.setswitchinterval(switch)
        assert failures == []
    run(go())
