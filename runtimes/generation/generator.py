"""A request's view of generation: text deltas and a finish reason, stop strings and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tokenizers import Tokenizer

from runtimes.generation.detokenize import Detokenizer
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import Request, Scheduler


@dataclass
class Delta:
    text: str = ""
    finish: str | None = None  # stop | length, on the last delta
    completion_tokens: int = 0


def _earliest_stop(text: str, stops: tuple[str, ...]) -> int:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else -1


def generate(scheduler: Scheduler, tokenizer: Tokenizer, prompt: list[int],
             params: SamplingParams) -> AsyncIterator[Delta]:
    """Queue the request now (SchedulerFull if there is no room) and return its stream of text.

    Closing the stream early (a client gone) cancels the sequence."""
    request = Request(prompt, params, asyncio.get_running_loop(), asyncio.Queue())
    scheduler.submit(request)
    return _deltas(request, tokenizer, params)


async def _deltas(request: Request, tokenizer: Tokenizer, params: SamplingParams) -> AsyncIterator[Delta]:
    detok = Detokenizer(tokenizer)
    held = ""  # text that might be the start of a stop string, not sent yet
    hold = max((len(s) for s in params.stop), default=1) - 1
    tokens = 0
    try:
        while True:
            event = await request.events.get()
            if event.error:
                raise RuntimeError(f"generation failed: {event.error}")
            if event.token is not None:
                tokens += 1
                held += detok.push(event.token)
            if event.finish is not None:
                held += detok.flush()
            cut = _earliest_stop(held, params.stop) if params.stop else -1
            if cut >= 0:
                request.cancelled = True  # the scheduler frees the slot at its next step
                yield Delta(held[:cut], "stop", tokens)
                return
            if event.finish is not None:
                yield Delta(held, "length" if event.finish == "length" else "stop", tokens)
                return
            ready = len(held) - hold if params.stop else len(held)
            if ready > 0:
                yield Delta(held[:ready], None, tokens)
                held = held[ready:]
    finally:
        request.cancelled = True
