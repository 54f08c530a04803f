"""The requests waiting for a slot: refused at the door when they could never run, else first come, first served.

The event loop's threads put requests in (submit) and the engine thread takes them (take); both hold the one
(reentrant) condition, which also wakes the engine thread when work arrives.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from runtimes.encoder_batcher import QueueFull
from runtimes.generation.requests import Event, Inadmissible, Request
from runtimes.generation.sampling import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS


@dataclass(frozen=True)
class Bounds:
    """What every running request keeps within: the queue's length, the context, the KV pool, the vocabulary."""

    max_queue: int
    context: int
    pool_tokens: int
    vocab: int

    def check(self, request: Request) -> None:
        """A breach is refused before the request can enter."""
        prompt, params = request.prompt, request.params
        if not prompt:
            raise Inadmissible("the prompt is empty")
        if params.max_tokens < 1 or len(prompt) + params.max_tokens > self.context:
            raise Inadmissible(f"{len(prompt)} prompt tokens plus max_tokens {params.max_tokens} exceed the "
                               f"context of {self.context}")
        if len(prompt) + 1 > self.pool_tokens:
            raise Inadmissible(f"the prompt's {len(prompt)} tokens do not fit the KV cache pool of "
                               f"{self.pool_tokens} tokens; shorten it, or serve with a larger MBUILD_KV_CACHE_MB")
        if min(prompt) < 0 or max(prompt) >= self.vocab:
            raise Inadmissible(f"prompt token ids must lie in 0..{self.vocab - 1}")
        if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS or len(params.logit_bias) > MAX_LOGIT_BIAS:
            raise Inadmissible(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids and {MAX_LOGIT_BIAS} logit_bias entries")
        if any(not 0 <= token < self.vocab for token, _ in params.logit_bias):
            raise Inadmissible(f"logit_bias token ids must lie in 0..{self.vocab - 1}")


class Waiting:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.queue: collections.deque[Request] = collections.deque()
        self.ready = threading.Condition()

    def submit(self, requests: list[Request]) -> None:
        """All of them enter, or none does (Inadmissible, QueueFull): a request's prompts x n together."""
        for request in requests:
            self.bounds.check(request)
        with self.ready:
            if self.live() + len(requests) > self.bounds.max_queue:
                raise QueueFull
            self.queue.extend(requests)
            self.ready.notify()

    def live(self) -> int:
        """The waiting requests not cancelled."""
        with self.ready:  # the other thread may be adding to or taking from the deque right now
            return sum(1 for r in self.queue if not r.cancelled)

    def take(self, fits: Callable[[Request], bool] = lambda _: True) -> Request | None:
        """The next live waiting request, if it fits (the scheduler asks only when a slot is free; it fits when the
        KV pool holds its prompt): else it stays first in the queue. Cancelled ones leave with their event. It never
        waits: the engine loop waits for work itself."""
        with self.ready:
            while self.queue:
                request = self.queue[0]
                if request.cancelled:
                    self.queue.popleft()
                    request.emit(Event(finish="cancelled"))
                    continue
                if not fits(request):
                    return None
                return self.queue.popleft()
        return None

    def wait(self, timeout: float, stopping: Callable[[], bool]) -> None:
        """Until a request waits, `stopping()` holds, or the timeout passes."""
        with self.ready:
            self.ready.wait_for(lambda: self.queue or stopping(), timeout=timeout)

    def wake(self) -> None:
        with self.ready:
            self.ready.notify_all()

    def drain(self) -> Iterable[Request]:
        """Every request left, taken out (a shutdown ends them)."""
        with self.ready:
            left, self.queue = list(self.queue), collections.deque()
        return left
