"""POST /v1/completions, and what both generation routes share: admission, runs of sequences, SSE streaming."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import fields
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, StreamingResponse

from runtimes.api.admission import enter, generation_runtime, off_loop, run_to_end, served
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.completion_shapes import CompletionChunks
from runtimes.api.errors import ApiError, OpenAIRoute, generation_failed, stream_deadline_exceeded
from runtimes.api.schemas_generation import MAX_PROMPTS, CompletionRequest, SamplingFields
from runtimes.api.structured import compile_constraint, guide_spec
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.sampling_request import Sampling, SamplingRequest, checked
from runtimes.generation.stream import Delta, GenerationFailed, Stream, start
from runtimes.ids import hex_id

router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])
# The body's fields that the shared check takes as they are, under the same names
SHARED = {f.name for f in fields(SamplingRequest)} & set(SamplingFields.model_fields)


def refuse_unsupported(fields: dict[str, bool]) -> None:
    """Fields OpenAI clients know but this server does not implement: a 400 naming the field, never ignored."""
    for name, sent in fields.items():
        if sent:
            raise ApiError(400, f"'{name}' is not supported by this server; remove it", "unsupported_parameter")


def check_token_ids(runtime: GenerationRuntime, prompts: list[list[int]]) -> None:
    vocab = runtime.engine.config.decoder.vocab_size
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ApiError(400, f"prompt {index} is empty", "empty_input")
        if vocab and (min(prompt) < 0 or max(prompt) >= vocab):
            raise ApiError(400, f"prompt {index} holds token ids outside 0..{vocab - 1}", "invalid_token_id")


def checked_sampling(body: SamplingFields, asked: int | None, logprobs: tuple[int | None, int | None] = (None, None),
                     stop_ids: tuple[int, ...] = ()) -> Sampling:
    """The body's sampling fields through the check every front door shares (errors.py makes its refusal a 400),
    before any prompt is tokenized. logprobs: (alternatives per generated token, per prompt token); None where not
    asked. stop_ids: the server's own, besides the body's."""
    sent = body.model_dump(include=SHARED)
    return checked(SamplingRequest(**{**sent, "max_tokens": asked, "logprobs": logprobs[0],
                                      "prompt_logprobs": logprobs[1],
                                      "stop_token_ids": [*body.stop_token_ids, *stop_ids]}))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _merged(streams: list[Stream]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave several choices' deltas as they come (n > 1, several prompts)."""
    # bounded: a pump waits while the reader does, so an unread stream stops taking its events and pauses
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue(maxsize=len(streams))

    async def pump(index: int, stream: Stream) -> None:
        try:
            async for delta in stream.deltas():
                await queue.put((index, delta))
            await queue.put((index, None))
        except Exception as exc:  # surfaced to the consumer below
            await queue.put((index, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            index, item = await queue.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Run:
    """One API call's sequences (prompts x n), admitted together and ended together: when one fails or
    the client leaves, every sibling is cancelled and stops using the engine at its next step."""

    def __init__(self, runtime: GenerationRuntime, jobs: list[tuple[list[int], SamplingParams]],
                 prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens  # OpenAI counts a prompt once, whatever n is
        self.streams = enter(lambda: start(runtime.engine_loop, runtime.tokenizer, jobs))
        self.text = [""] * len(self.streams)
        self.token_ids: list[list[int]] = [[] for _ in self.streams]
        self.finish: list[str | None] = [None] * len(self.streams)
        self.tokens = [0] * len(self.streams)
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in self.streams]
        self.ends: list[list[int]] = [[] for _ in self.streams]  # where each logprob's token ends in the text
        self.prompt_logprobs: list[tuple[TokenLogprob | None, ...] | None] = [None] * len(self.streams)
        self.speculating = runtime.engine_loop.config.speculation.on
        self.drafted = self.accepted = 0  # over every sequence, as llama.cpp's timings count them

    def timings(self) -> dict[str, Any]:
        """llama.cpp's per-response draft counts, when the server speculates."""
        return {"timings": {"draft_n": self.drafted, "draft_n_accepted": self.accepted}} if self.speculating else {}

    def started(self) -> bool:
        return any(stream.started for stream in self.streams)

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        try:
            async for index, delta in _merged(self.streams):
                self.text[index] += delta.text
                self.token_ids[index] += delta.tokens
                self.tokens[index] = delta.completion_tokens
                self.logprobs[index] += delta.logprobs
                self.ends[index] += delta.ends
                if delta.prompt_logprobs is not None:
                    self.prompt_logprobs[index] = delta.prompt_logprobs
                if delta.finish:
                    self.finish[index] = delta.finish
                    self.drafted, self.accepted = self.drafted + delta.drafted, self.accepted + delta.accepted
                yield index, delta
        finally:
            for stream in self.streams:  # also those whose pump never began
                stream.cancel()

    async def drain(self) -> None:
        async for _ in self.deltas():
            pass


def check_sequences(runtime: GenerationRuntime, sequences: int, what: str) -> None:
    """A request the queue can never hold whole is the caller's 400 (a 429 would ask for retries that never pass)."""
    most = runtime.engine_loop.config.max_queue
    if sequences > most:
        raise ApiError(400, f"this request asks for {sequences} {what}; this server queues at most {most} sequences "
                            f"(MBUILD_MAX_QUEUE): send at most {most} a request", "too_many_sequences")


def admit_run(runtime: GenerationRuntime, sampling: Sampling, n: int, prompts: list[list[int]]) -> Run:
    """Context fit for every prompt x n, the request's size against the queue, then all of it or none."""
    check_sequences(runtime, len(prompts) * n, "sequences (prompts x n)")
    indexed = len(prompts) > 1
    jobs = [(p, sampling.fit(runtime.context, len(p), i if indexed else None, c))
            for i, p in enumerate(prompts) for c in range(n)]
    return Run(runtime, jobs, sum(len(p) for p in prompts))


# JSON leaves these raw, but Python's str.splitlines (httpx's aiter_lines, so many SSE clients) and some JavaScript
# parsers end a line at them: a token that decodes to one would cut an event in two. Escaped, any client reads it.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_event(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False).translate(_LINE_BREAKS)
    return f"data: {text}\n\n".encode()


def _stream(run: Run, chunk: Any, include_usage: bool, timeout: float) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        try:
            async with asyncio.timeout(timeout):  # a stream's whole life, queue wait included
                for head in chunk.first():
                    yield sse_event(head)
                async for index, delta in run.deltas():
                    for piece in chunk.pieces(index, delta):
                        yield sse_event(piece)
            if include_usage:
                yield sse_event({**chunk.usage(_usage(run.prompt_tokens, sum(run.tokens))), **run.timings()})
            yield sse_event("[DONE]")
        except GenerationFailed as exc:  # the engine failed this stream: say so in the stream, then end it
            yield sse_event(generation_failed(exc).body())
        except TimeoutError:
            yield sse_event(stream_deadline_exceeded(timeout).body())

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def respond(request: Request, body: SamplingFields, run: Run, chunks: Any,
                  whole: Callable[[], dict[str, Any]]) -> Any:
    """Stream the run as SSE chunks when asked; else wait for all of it and answer once, usage added."""
    settings = served(request).settings
    if body.stream:
        return _stream(run, chunks, bool(body.stream_options and body.stream_options.include_usage),
                       settings.stream_timeout)
    try:
        await run_to_end(request, run.drain(), settings.request_timeout, run.started)
    except GenerationFailed as exc:
        raise generation_failed(exc) from exc
    return JSONResponse({**whole(), "usage": _usage(run.prompt_tokens, sum(run.tokens)), **run.timings()})


Prompt = str | list[str] | list[int] | list[list[int]]


def _items(prompt: Prompt) -> list[str | list[int]]:
    """The prompt field as one item per prompt: a text, or token ids."""
    if isinstance(prompt, str) or (prompt and all(isinstance(p, int) for p in prompt)):
        return [prompt]  # type: ignore[list-item]
    return [p for p in prompt if isinstance(p, str | list)]


def _prompts(runtime: GenerationRuntime, prompt: Prompt) -> list[list[int]]:
    items = _items(prompt)
    if not items:
        raise ApiError(400, "'prompt' is empty", "empty_input")
    if len(items) > MAX_PROMPTS:
        raise ApiError(400, f"'prompt' holds {len(items)} prompts; at most {MAX_PROMPTS} per request",
                       "too_many_inputs")
    return [runtime.encode(item) if isinstance(item, str) else list(item) for item in items]


@router.post("/v1/completions", tags=["inference"], openapi_extra=openapi_body(CompletionRequest))
async def completions(request: Request) -> Any:
    state = served(request)
    body = await parse_body(request, CompletionRequest)
    runtime = generation_runtime(state, body.model)
    refuse_unsupported({"suffix": bool(body.suffix)})
    sampling = checked_sampling(body, body.max_tokens, (body.logprobs, body.logprobs if body.echo else None))
    grammar = await compile_constraint(runtime, guide_spec(body))
    size = len(body.prompt) if isinstance(body.prompt, str) else sum(len(p) for p in body.prompt
                                                                      if isinstance(p, str))
    prompts = await off_loop(_prompts, runtime, body.prompt, size=size)
    check_token_ids(runtime, prompts)
    run = admit_run(runtime, sampling.serving(grammar), body.n, prompts)
    ident, created, model = f"cmpl-{hex_id()}", int(time.time()), state.served_names()[0]
    # With echo, each choice (prompts x n) starts with its prompt: as sent when it was text, else decoded.
    texts = [item if isinstance(item, str) else runtime.tokenizer.decode(ids, skip_special_tokens=False)
             for item, ids in zip(_items(body.prompt), prompts, strict=True)]
    echo = [(texts[i // body.n], prompts[i // body.n]) for i in range(len(prompts) * body.n)] if body.echo else None
    chunks = CompletionChunks(ident, model, created, runtime.tokenizer, echo, body.logprobs is not None)
    return await respond(request, body, run, chunks, lambda: {
        "id": ident, "object": "text_completion", "created": created, "model": model,
        "choices": [chunks.whole(i, run.text[i], run.logprobs[i], run.prompt_logprobs[i], run.finish[i])
                    for i in range(len(run.text))],
    })
