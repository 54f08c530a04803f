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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from runtimes.engines.decoder import Batch
from runtimes.generation import scheduler as scheduler_module
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import Event, Inadmissible, Request, Scheduler, SchedulerFull
from runtimes.metrics import Metrics

VOCAB, CONTEXT = 50, 64


class FakeEngine:
    """Row key = sum(prompt); next token = (7 * key + 3 * position) % VOCAB, whatever the batch holds."""

    def __init__(self) -> None:
        self.fail_prefill: Callable[[list[list[int]]], bool] = lambda prompts: False
        self.fail_decode_at: int | None = None
        self.steps = 0

    @staticmethod
    def _logits(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = np.zeros((len(keys), VOCAB), np.float32)
        out[np.arange(len(keys)), (7 * keys + 3 * positions) % VOCAB] = 10.0
        return out

    def prefill(self, prompts: list[list[int]]) -> tuple[np.ndarray, Batch]:
        if self.fail_prefill(prompts):
            raise RuntimeError("prefill exploded")
        keys = np.array([sum(p) for p in prompts], np.int64)
        positions = np.array([len(p) for p in prompts], np.int64)
        return self._logits(keys, positions), Batch([keys], np.ones((len(prompts), 1), np.int64), positions)

    def decode(self, batch: Batch, tokens: np.ndarray) -> tuple[np.ndarray, Batch]:
        self.steps += 1
        if self.fail_decode_at == self.steps:
            raise RuntimeError("decode exploded")
        positions = batch.positions + 1
        return self._logits(batch.kv[0], positions), Batch(batch.kv, batch.mask, positions)

    @staticmethod
    def merge(running: Batch | None, joining: Batch) -> Batch:
        if running is None:
            return joining
        return Batch([np.concatenate([running.kv[0], joining.kv[0]])], np.concatenate([running.mask, joining.mask]),
                     np.concatenate([running.positions, joining.positions]))

    @staticmethod
    def keep(batch: Batch, rows: list[int]) -> Batch:
        return Batch([batch.kv[0][rows]], batch.mask[rows], batch.positions[rows])


def make(engine: FakeEngine | None = None, max_batch: int = 4, max_queue: int = 16) -> Scheduler:
    return Scheduler(engine or FakeEngine(), (), max_batch, max_queue, Metrics(), CONTEXT, VOCAB)  # type: ignore[arg-type]


def request(prompt: list[int], max_tokens: int = 6, **params: Any) -> Request:
    return Request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **params),
                   asyncio.get_running_loop(), asyncio.Queue())


async def events(req: Request) -> list[Event]:
    await asyncio.sleep(0)  # emit() hands events over through the loop
    out = []
    while not req.events.empty():
        out.append(req.events.get_nowait())
    return out


def tokens_and_finish(got: list[Event]) -> tuple[list[int], str | None]:
    """The tokens, and the one finishing event, which must be the last event."""
    finishes = [i for i, e in enumerate(got) if e.finish is not None]
    assert len(finishes) <= 1 and (not finishes or finishes[0] == len(got) - 1), got
    return [e.token for e in got if e.token is not None], got[finishes[0]].finish if finishes else None


async def run_until_idle(scheduler: Scheduler, requests: list[Request], limit: int = 100) -> dict[int, list[Event]]:
    seen: dict[int, list[Event]] = {r.id: [] for r in requests}
    for _ in range(limit):
        scheduler.admit()
        scheduler.step()
        for r in requests:
            seen[r.id] += await events(r)
        if not scheduler.rows and not scheduler.waiting:
            break
    return seen


def expected(prompt: list[int], count: int) -> list[int]:
    return [(7 * sum(prompt) + 3 * (len(prompt) + i)) % VOCAB for i in range(count)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_request_joining_mid_decode_changes_no_one_s_output() -> None:
    async def go() -> None:
        scheduler = make()
        first = request([1, 2, 3], max_tokens=8)
        scheduler.submit([first])
        scheduler.admit()
        scheduler.step()
        scheduler.step()
        second = request([9, 9], max_tokens=5)
        scheduler.submit([second])
        seen = await run_until_idle(scheduler, [first, second])
        got_first = tokens_and_finish(seen[first.id])
        got_second = tokens_and_finish(seen[second.id])
        assert got_first == (expected([1, 2, 3], 8), "length")
        assert got_second == (expected([9, 9], 5), "length")
    run(go())


def test_a_cancelled_request_leaves_at_the_next_step_and_the_other_goes_on() -> None:
    async def go() -> None:
        scheduler = make()
        leaving, staying = request([4], max_tokens=20), request([5], max_tokens=6)
        scheduler.submit([leaving, staying])
        scheduler.admit()
        leaving.cancelled = True
        scheduler.step()
        assert [row.request.id for row in scheduler.rows] == [staying.id]
        seen = await run_until_idle(scheduler, [leaving, staying])
        assert tokens_and_finish(seen[leaving.id])[1] == "cancelled"
        assert tokens_and_finish(seen[staying.id]) == (expected([5], 6), "length")
        waiting = request([6])
        scheduler.submit([waiting])
        waiting.cancelled = True  # a client that left while queued never reaches the engine
        assert scheduler.busy == 0
        seen = await run_until_idle(scheduler, [waiting])
        assert tokens_and_finish(seen[waiting.id]) == ([], "cancelled")
    run(go())


def test_a_stop_token_ends_the_sequence_with_stop() -> None:
    async def go() -> None:
        scheduler = make()
        want = expected([2, 2], 6)
        stopping = request([2, 2], max_tokens=6, stop_token_ids=frozenset({want[2]}))
        scheduler.submit([stopping])
        seen = await run_until_idle(scheduler, [stopping])
        assert tokens_and_finish(seen[stopping.id]) == (want[:2], "stop")
    run(go())


def test_an_engine_error_ends_the_affected_requests_with_events_and_the_rest_still_run() -> None:
    async def go() -> None:
        engine = FakeEngine()
        scheduler = make(engine)
        running = [request([1], max_tokens=10), request([2], max_tokens=10)]
        scheduler.submit(running)
        scheduler.admit()
        engine.fail_decode_at = engine.steps + 1
        engine.fail_prefill = lambda prompts: [13] in prompts
        joining = [request([13]), request([14])]  # they join in the same prefill as the poisoned prompt
        scheduler.submit(joining)
        later = request([3], max_tokens=4)
        seen = await run_until_idle(scheduler, running + joining)
        for r in running + joining:  # every one ended, with an error and nothing after it
            assert tokens_and_finish(seen[r.id])[1] == "error"
            assert seen[r.id][-1].error
        scheduler.submit([later])
        seen = await run_until_idle(scheduler, [later])
        assert tokens_and_finish(seen[later.id]) == (expected([3], 4), "length")
    run(go())


def test_shutdown_with_requests_in_flight_ends_each_one_once() -> None:
    async def go() -> None:
        scheduler = make(max_batch=2)
        requests = [request([i + 1], max_tokens=30) for i in range(5)]
        scheduler.submit(requests)
        scheduler.admit()
        scheduler.step()
        scheduler.stop()  # the thread never started: stop still ends everything
        for r in requests:
            assert tokens_and_finish(await events(r))[1] == "error"
        assert scheduler.busy == 0
    run(go())


def test_submit_keeps_its_invariants_and_admits_all_or_nothing() -> None:
    async def go() -> None:
        scheduler = make(max_queue=3)
        for bad in (request([]), request([1] * 60, max_tokens=10), request([VOCAB]), request([-1]),
                    request([1], stop_token_ids=frozenset(range(65)))):
            with pytest.raises(Inadmissible):
                scheduler.submit([bad])
        with pytest.raises(SchedulerFull):
            scheduler.submit([request([1]) for _ in range(4)])
        assert not scheduler.waiting  # nothing of the refused request stayed queued
        scheduler.submit([request([1]) for _ in range(3)])
        assert scheduler.busy == 3
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
        scheduler = make(max_batch=8)
        loop = asyncio.get_running_loop()
        innocents = [Request(p, SamplingParams(max_tokens=12, temperature=0.9, top_k=5, seed=i), loop, asyncio.Queue())
                     for i, p in enumerate(prompts)]
        extra = [request([42, 1], max_tokens=12)] if with_failing else []
        scheduler.submit(innocents[:2] + extra + innocents[2:])
        with failing_sampler(42, at_token=3):
            seen = await run_until_idle(scheduler, innocents + extra)
        if extra:
            assert tokens_and_finish(seen[extra[0].id]) == (expected([42, 1], 3), "error")
        return {i: tokens_and_finish(seen[r.id]) for i, r in enumerate(innocents)}

    alone, beside = run(outputs(False)), run(outputs(True))
    assert alone == beside and all(finish == "length" for _, finish in alone.values())


def test_the_queue_can_be_counted_while_the_engine_thread_takes_from_it() -> None:
    """busy and the gauges count the waiting queue from the event loop while the engine thread pops it."""
    async def go() -> None:
        scheduler = make(max_batch=1, max_queue=10_000)
        failures: list[BaseException] = []
        stop = threading.Event()

        def take() -> None:
            while not stop.is_set():
                try:
                    scheduler.take_joining(block=False)
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
                with contextlib.suppress(SchedulerFull):
                    scheduler.submit(batch)
                _ = scheduler.busy
                scheduler.refresh_metrics()
        finally:
            stop.set()
            taker.join()
            sys.setswitchinterval(switch)
        assert failures == []
    run(go())
