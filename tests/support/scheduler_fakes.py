"""A deterministic fake of the decoder engine's slot interface, and helpers to drive the scheduler with it.

The fake stands in for the ONNX graph only (the KV cache's contents are token lists); the scheduler is real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from runtimes.generation.requests import Event, Request
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import Scheduler
from runtimes.metrics import Metrics

VOCAB, CONTEXT = 50, 64


class FakeEngine:
    """Slots of token lists, as the real engine's KV cache holds positions; a row's next token is
    (7 * sum(its tokens) + 3 * len(its tokens)) % VOCAB, whatever else the batch holds. So a sequence's
    output changes if its cache is lost, mixed with another's, or moved wrong between slots."""

    bytes_per_token = 8

    def __init__(self, slots: int = 16) -> None:
        self.fail_prefill: Callable[[list[int]], bool] = lambda tokens: False
        self.fail_decode_at: int | None = None
        self.steps = 0
        self.slots: list[list[int]] = [[] for _ in range(slots)]
        self.prefilled: list[int] = []  # tokens per prefill call

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.slots], np.int64)

    def run(self, first: int, ids: np.ndarray) -> np.ndarray:
        if ids.shape[1] == 1 and first == 0:
            self.steps += 1
            if self.fail_decode_at == self.steps:
                raise RuntimeError("decode exploded")
        elif self.fail_prefill(ids[0].tolist()):
            raise RuntimeError("prefill exploded")
        if ids.shape[1] > 1 or first > 0:
            self.prefilled.append(ids.shape[1])
        out = np.zeros((len(ids), VOCAB), np.float32)
        for offset, row in enumerate(ids.tolist()):
            held = self.slots[first + offset]
            held += row
            out[offset, (7 * sum(held) + 3 * len(held)) % VOCAB] = 10.0
        return out

    def move(self, source: int, target: int) -> None:
        if source != target:
            self.slots[target], self.slots[source] = self.slots[source], []

    def release(self, row: int) -> None:
        self.slots[row] = []

    def read(self, row: int, count: int) -> list[np.ndarray]:
        return [np.array(self.slots[row][:count])]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        self.slots[row] = blocks[0][:count].tolist()


def make(engine: FakeEngine | None = None, max_batch: int = 4, max_queue: int = 16, context: int = CONTEXT,
         **options: Any) -> Scheduler:
    return Scheduler(engine or FakeEngine(), (), max_batch, max_queue, Metrics(), context, VOCAB,  # type: ignore[arg-type]
                     **options)


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
        if not scheduler.rows and not scheduler.waiting and scheduler.filling is None:
            break
    return seen


def expected(prompt: list[int], count: int) -> list[int]:
    held, out = list(prompt), []
    for _ in range(count):
        out.append((7 * sum(held) + 3 * len(held)) % VOCAB)
        held.append(out[-1])
    return out


