"""A deterministic fake of the decoder engine's step interface, and helpers to drive the scheduler with it.

The fake stands in for the ONNX graph only (the KV cache's contents are token lists, a step's works run one by
one); the scheduler is real. The real engine's packing of works into runs is tested on the real graph.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from runtimes.engines.step import StepOutput, Work, pack, start, unsupported
from runtimes.generation.draft import DraftModel
from runtimes.generation.engine_loop import EngineLoop
from runtimes.generation.requests import Event, Request
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import SchedulerConfig
from runtimes.metrics import Metrics

VOCAB, CONTEXT = 50, 64
PAD = -1  # what padding writes in the fake's positions: never a token, so a rule that reads it answers otherwise


def by_sum(held: list[int]) -> int:
    return (7 * sum(held) + 3 * len(held)) % VOCAB


class FakeEngine:
    """Slots of token positions, as the real engine's KV cache holds them: each slot's buffer keeps what was written
    until it is overwritten or its pages are forgotten, and its length is what the slot holds now (a released slot
    holds nothing, its buffer still there). A row's next token is rule(its tokens), whatever else the step holds. The
    default rule, (7 * sum + 3 * len) % VOCAB, changes a sequence's output if its cache is lost, mixed with another's,
    or taken back wrong; reusing positions that were forgotten or never written fails an assertion."""

    bytes_per_token = 8

    def __init__(self, slots: int = 16, rule: Callable[[list[int]], int] = by_sum) -> None:
        self.rule = rule
        self.fail_prefill: Callable[[list[int]], bool] = lambda tokens: False  # on a slot's first tokens
        self.fail_decode_at: int | None = None  # the step whose one-token works on held slots fail
        self.steps = 0
        self.buffers: list[list[int]] = [[] for _ in range(slots)]  # what each slot's positions hold
        self.held = np.zeros(slots, np.int64)  # per slot, the positions it holds now
        self.kept = np.zeros(slots, np.int64)  # per free slot, the positions its last sequence left
        self.context = 1 << 20  # packing's bound: the scheduler keeps every work within its own context
        self.works: list[Work] = []  # every work run, in order
        self.reach = np.zeros(slots, np.int64)  # per slot, how far its positions have reached (the pages' extent)
        self.forgotten: list[tuple[int, int]] = []  # every forget, in order
        self.copies: list[tuple[str, int, int]] = []  # every prefix restore: ("write" | "copy" | "keep", slot, count)

    @property
    def slots(self) -> list[list[int]]:
        """What each slot holds now."""
        return [buffer[:length] for buffer, length in zip(self.buffers, self.held.tolist(), strict=True)]

    @property
    def lengths(self) -> np.ndarray:
        return self.held.copy()

    @property
    def written(self) -> np.ndarray:
        return np.maximum(self.reach, self.lengths)

    def forget(self, slot: int, keep: int) -> None:
        """The KV pool hands back pages past `keep`: never a position the slot still holds."""
        assert keep >= self.held[slot], f"slot {slot} holds {self.held[slot]} positions, not {keep}"
        self.reach[slot] = min(self.reach[slot], keep)
        self.kept[slot] = min(self.kept[slot], keep)
        del self.buffers[slot][keep:]
        self.forgotten.append((slot, keep))

    def step(self, works: Sequence[Work]) -> StepOutput:
        """The works packed into runs as the real engine packs them (step.pack), each slot of a run without work
        padded where the real engine's padding writes (step.start), with PAD tokens: a cache that padding could
        overwrite is then lost here too."""
        self.steps += 1
        results: dict[int, np.ndarray | Exception] = {w.slot: e for w in works if (e := unsupported(w)) is not None}
        works = [work for work in works if work.slot not in results]
        for run in pack(works, self.lengths.tolist(), self.context, self.kept.tolist()):
            for offset, work in enumerate(run.rows):
                if work is not None:
                    results[work.slot] = self._work(work)
                    continue
                slot = run.first + offset
                at = start(int(self.held[slot]), int(self.kept[slot]), False)
                self._write(slot, at, [PAD] * run.width)
        return StepOutput.of(results)

    def _work(self, work: Work) -> np.ndarray | Exception:
        length = int(self.held[work.slot])
        if (not length and self.fail_prefill(list(work.tokens))) or \
                (length and len(work.tokens) == 1 and self.fail_decode_at == self.steps):
            return RuntimeError("the engine exploded")
        self.works.append(work)
        self._write(work.slot, length, list(work.tokens))
        self.held[work.slot], self.kept[work.slot] = length + len(work.tokens), 0
        held = self.buffers[work.slot][:length + len(work.tokens)]
        logits = np.zeros((work.logits, VOCAB), np.float32)
        for row, end in enumerate(range(len(held) - work.logits + 1, len(held) + 1)):
            logits[row, self.rule(held[:end])] = 10.0
        return logits

    def _write(self, slot: int, at: int, tokens: list[int]) -> None:
        buffer = self.buffers[slot]
        buffer.extend([PAD] * (at - len(buffer)))  # positions never written: padding's, as far as anyone knows
        buffer[at:at + len(tokens)] = tokens
        self.reach[slot] = max(self.reach[slot], at + len(tokens))

    def truncate(self, slot: int, length: int) -> None:
        assert length <= self.held[slot]
        self.held[slot] = length

    def release(self, row: int) -> None:
        self.kept[row], self.held[row] = self.held[row], 0

    def read(self, row: int, count: int) -> list[np.ndarray]:
        assert count <= len(self.buffers[row]), f"slot {row}: {count} positions read, {len(self.buffers[row])} kept"
        return [np.array(self.buffers[row][:count])]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        self.buffers[row][:count] = blocks[0][:count].tolist()
        self.copies.append(("write", row, count))
        self._hold(row, count)

    def copy(self, source: int, row: int, count: int) -> None:
        assert count <= len(self.buffers[source]), f"slot {source}'s {count} positions were not kept"
        self.buffers[row][:count] = self.buffers[source][:count]
        self.copies.append(("copy", row, count))
        self._hold(row, count)

    def keep(self, row: int, count: int) -> None:
        assert count <= len(self.buffers[row]), f"slot {row}'s {count} positions were not kept"
        if count:
            self.copies.append(("keep", row, count))
        self._hold(row, count)

    def _hold(self, row: int, count: int) -> None:
        self.held[row], self.kept[row] = count, 0
        self.reach[row] = max(self.reach[row], count)


def make(engine: FakeEngine | None = None, max_batch: int = 4, max_queue: int = 16, context: int = CONTEXT,
         draft: DraftModel | None = None, **options: Any) -> EngineLoop:
    """An engine loop over the fake (options: SchedulerConfig's), driven by tick() rather than its thread."""
    return EngineLoop(engine or FakeEngine(), SchedulerConfig((), max_batch, max_queue, context, VOCAB, **options),
                      Metrics(), draft)


def request(prompt: list[int], max_tokens: int = 6, **params: Any) -> Request:
    return Request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **params),
                   asyncio.get_running_loop(), asyncio.Queue())


async def events(req: Request) -> list[Event]:
    await asyncio.sleep(0)  # emit() hands events over through the loop
    out = []
    while not req.events.empty():
        out.append(await req.next_event())
    return out


def tokens_and_finish(got: list[Event]) -> tuple[list[int], str | None]:
    """The tokens, and the one finishing event, which must be the last event."""
    finishes = [i for i, e in enumerate(got) if e.finish is not None]
    assert len(finishes) <= 1 and (not finishes or finishes[0] == len(got) - 1), got
    return [e.token for e in got if e.token is not None], got[finishes[0]].finish if finishes else None


async def run_until_idle(loop: EngineLoop, requests: list[Request], limit: int = 100) -> dict[int, list[Event]]:
    seen: dict[int, list[Event]] = {r.id: [] for r in requests}
    for _ in range(limit):
        loop.tick()
        for r in requests:
            seen[r.id] += await events(r)
        if not loop.scheduler.rows and not loop.waiting.queue:
            break
    return seen


def expected(prompt: list[int], count: int, rule: Callable[[list[int]], int] = by_sum) -> list[int]:
    held, out = list(prompt), []
    for _ in range(count):
        out.append(rule(held))
        held.append(out[-1])
    return out


