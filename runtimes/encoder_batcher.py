"""A dynamic batcher that never waits on an idle queue.

While the engine runs one batch, new requests queue; the next batch takes everything waiting, up
to max_batch sequences. At concurrency 1 a request runs at once (no added delay); under load
batches fill by themselves, and max_delay (the profile's max_batch_delay_ms) lets a batch wait that
long for more only while the last one had company. The queue is bounded: past max_queue requests,
submit() refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sized
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from runtimes.metrics import BATCH_BUCKETS, Metrics


class QueueFull(Exception):
    pass


# What a batch is made of: a sequence's token ids (embeddings), a tokenized pair (rerankers); its length is its
# tokens, which the batch is sorted by.
T = TypeVar("T", bound=Sized)


@dataclass(eq=False)  # hashed by identity: jobs sit in a set while they wait
class Job(Generic[T]):
    future: asyncio.Future[np.ndarray]
    seqs: list[T] = field(default_factory=list)
    enqueued: float = field(default_factory=time.perf_counter)
    queued: bool = False  # its sequences are in the queue (a reserved job's are still being tokenized)
    started: bool = False  # its batch reached the engine

    @property
    def abandoned(self) -> bool:
        return self.future.done()  # cancelled by its caller (client gone, deadline) or already answered


class Batcher(Generic[T]):
    def __init__(self, run: Callable[[list[T]], np.ndarray], max_batch: int, max_queue: int,
                 metrics: Metrics, max_delay: float = 0.0) -> None:
        self._run = run
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.max_delay = max_delay
        self._last_batch = 0
        self._metrics = metrics
        self._queue: asyncio.Queue[Job[T]] = asyncio.Queue()
        self._held: Job[T] | None = None  # taken from the queue but too big for the last batch
        self._waiting: set[Job[T]] = set()  # live jobs not yet in a batch: the queue depth
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._task: asyncio.Task[None] | None = None
        self.in_flight = 0
        metrics.describe("batch_size", "Sequences per engine call", BATCH_BUCKETS)
        metrics.describe("queue_seconds", "Time a request waited before its batch ran")
        metrics.describe("compute_seconds", "Engine time per batch")
        metrics.describe("queue_depth", "Requests waiting for the engine")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def reserve(self) -> Job[T]:
        """A place in the queue for one request (QueueFull when there is none), taken before its inputs are
        tokenized: at most max_queue requests hold tokenized inputs at once, and a refusal costs no work. Cancel
        its future to give the place back."""
        if len(self._waiting) >= self.max_queue:
            raise QueueFull
        job: Job[T] = Job(asyncio.get_running_loop().create_future())
        self.in_flight += 1
        self._waiting.add(job)
        job.future.add_done_callback(lambda _: self._finished(job))
        self._metrics.set("queue_depth", len(self._waiting))
        return job

    def post(self, job: Job[T], seqs: list[T]) -> None:
        """A reserved job's sequences, into the queue for the engine."""
        if job.future.done():
            return  # abandoned meanwhile
        job.seqs, job.queued, job.enqueued = seqs, True, time.perf_counter()
        self._queue.put_nowait(job)

    def enqueue(self, seqs: list[T]) -> Job[T]:
        """Queue one request's sequences (QueueFull when there is no room); cancel its future to abandon it."""
        job = self.reserve()
        self.post(job, seqs)
        return job

    def _finished(self, job: Job[T]) -> None:
        # An abandoned job leaves the count at once, even while it still sits in the queue.
        self.in_flight -= 1
        self._waiting.discard(job)
        self._metrics.set("queue_depth", len(self._waiting))

    async def submit(self, seqs: list[T]) -> np.ndarray:
        return await self.enqueue(seqs).future

    async def _next_job(self) -> Job[T]:
        if self._held is not None:
            job, self._held = self._held, None
            return job
        return await self._queue.get()

    async def _take_batch(self, first: Job[T]) -> list[Job[T]]:
        jobs, count = [first], len(first.seqs)
        deadline = time.perf_counter() + (self.max_delay if self._last_batch > 1 else 0.0)
        while count < self.max_batch:
            if self._queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                nxt = self._queue.get_nowait()
            if count + len(nxt.seqs) > self.max_batch:
                self._held = nxt  # it opens the next batch instead of overflowing this one
                break
            jobs.append(nxt)
            count += len(nxt.seqs)
        self._last_batch = len(jobs)
        return jobs

    def _compute(self, seqs: list[T], jobs: list[Job[T]]) -> np.ndarray | None:
        """Rows for seqs, chunk by chunk; None once every job in the batch was abandoned (no more compute)."""
        # Sorting by length keeps padding small inside each engine call.
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        out: np.ndarray | None = None
        for start in range(0, len(order), self.max_batch):
            if all(job.abandoned for job in jobs):
                return None
            chunk = order[start : start + self.max_batch]
            rows = self._run([seqs[i] for i in chunk])
            if out is None:
                out = np.empty((len(seqs), *rows.shape[1:]), dtype=rows.dtype)
            out[chunk] = rows
            self._metrics.observe("batch_size", len(chunk))
        assert out is not None
        return out

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._take_batch(await self._next_job())
            self._waiting.difference_update(jobs)
            self._metrics.set("queue_depth", len(self._waiting))
            live = [j for j in jobs if not j.future.done()]  # a cancelled client needs no compute
            if not live:
                continue
            now = time.perf_counter()
            for job in live:
                job.started = True
                self._metrics.observe("queue_seconds", now - job.enqueued)
            seqs = [s for job in live for s in job.seqs]
            try:
                result = await loop.run_in_executor(self._executor, self._compute, seqs, live)
            except Exception as exc:  # hand the engine's failure to every waiting request
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            self._metrics.observe("compute_seconds", time.perf_counter() - now)
            if result is None:
                continue
            offset = 0
            for job in live:
                if not job.future.done():
                    job.future.set_result(result[offset : offset + len(job.seqs)])
                offset += len(job.seqs)
