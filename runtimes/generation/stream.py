"""A request's view of generation: text deltas and a finish reason, stop strings and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from runtimes.generation.detokenize import Detokenizer
from runtimes.generation.engine_loop import EngineLoop
from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.requests import Request
from runtimes.generation.sampling import SamplingParams


class GenerationFailed(RuntimeError):
    """The engine or the sampler failed this sequence; the server goes on. refused: the request's own output
    constraint could not go on (a 400), not the server (a 500)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class Delta:
    text: str = ""
    finish: str | None = None  # stop | length, on the last delta
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tokens made since the last delta, if asked
    ends: list[int] = field(default_factory=list)  # where each of those tokens' text ends in the sequence's text
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # on the first delta, if asked
    tokens: list[int] = field(default_factory=list)  # the ids made since the last delta (harmony reads ids)
    drafted: int = 0  # on the last delta: draft tokens verified for the sequence (speculative decoding) ...
    accepted: int = 0  # ... and accepted


def _earliest_stop(text: str, stops: tuple[str, ...]) -> int:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else -1


class Stream:
    """One sequence's text as it is made. Leaving `deltas` early (a client gone) cancels the sequence."""

    def __init__(self, request: Request, tokenizer: Tokenizer) -> None:
        self.request, self.tokenizer = request, tokenizer

    @property
    def started(self) -> bool:
        return self.request.admitted

    def cancel(self) -> None:
        self.request.cancelled = True  # the scheduler frees the slot (or drops it from the queue) next step

    async def deltas(self) -> AsyncIterator[Delta]:
        params = self.request.params
        detok = Detokenizer(self.tokenizer, self.request.prompt, params.skip_special_tokens, params.keep_special_tokens)
        held = ""  # text that might be the start of a stop string, not sent yet
        hold = max((len(s) for s in params.stop), default=1) - 1
        tokens = 0
        logprobs: list[TokenLogprob] = []  # of tokens whose text has not gone out yet
        ends: list[int] = []  # the same tokens' text ends, as offsets into the text (what a reader is fed)
        ids: list[int] = []  # the same tokens' ids
        prompt: tuple[TokenLogprob | None, ...] | None = None
        drafted = accepted = 0
        try:
            while True:
                event = await self.request.next_event()
                if event.error:
                    raise GenerationFailed(f"generation failed: {event.error}", event.refused)
                if event.prompt_logprobs is not None:
                    prompt = event.prompt_logprobs
                drafted, accepted = event.drafted, event.accepted  # the finishing event's: 0 before
                if event.token is not None:
                    tokens += 1
                    ids.append(event.token)
                    held += detok.push(event.token)
                    if event.logprob is not None:
                        logprobs.append(event.logprob)
                        ends.append(len(detok.text))
                if event.finish is not None:
                    held += detok.flush()
                cut = _earliest_stop(held, params.stop) if params.stop else -1
                if cut >= 0:
                    yield Delta(held[:cut], "stop", tokens, logprobs, ends, prompt, ids, drafted, accepted)
                    return
                if event.finish is not None:
                    yield Delta(held, "length" if event.finish == "length" else "stop", tokens, logprobs, ends,
                                prompt, ids, event.drafted, event.accepted)
                    return
                if not self.request.events.empty():
                    continue  # a step's tokens go out as one delta: a verify row's several, one chunk (as vLLM's)
                ready = len(held) - hold if params.stop else len(held)
                if ready > 0:
                    yield Delta(held[:ready], None, tokens, logprobs, ends, prompt, ids)
                    held, logprobs, ends, prompt, ids = held[ready:], [], [], None, []
        finally:
            self.cancel()


def start(engine_loop: EngineLoop, tokenizer: Tokenizer, jobs: list[tuple[list[int], SamplingParams]]) -> list[Stream]:
    """Queue every sequence of one API call together (QueueFull or Inadmissible: none of them)."""
    loop = asyncio.get_running_loop()
    requests = [Request(prompt, params, loop, asyncio.Queue()) for prompt, params in jobs]
    engine_loop.submit(requests)
    return [Stream(request, tokenizer) for request in requests]
