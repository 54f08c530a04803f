"""POST /v1/chat/completions and /v1/completions in the OpenAI shape, streamed as server-sent events."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, StreamingResponse

from runtimes.api.auth import check_bearer
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.errors import ApiError, overloaded, timed_out
from runtimes.api.schemas_generation import ChatCompletionRequest, CompletionRequest, _Sampling
from runtimes.generation.chat_template import ChatTemplateError
from runtimes.generation.generator import Delta, generate
from runtimes.generation.runtime import GenerationRuntime
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import SchedulerFull
from runtimes.state import ServiceState, serving

router = APIRouter()
Body = TypeVar("Body", bound=_Sampling)


def _runtime(state: ServiceState, body: _Sampling) -> GenerationRuntime:
    if state.config is not None and state.config.task != "text-generation":
        raise ApiError(404, "this model serves /v1/embeddings, not text generation", "wrong_task")
    names = state.served_names()
    if body.model is not None and body.model not in names:
        raise ApiError(404, f"model {body.model!r} is not served here; use {names[0]!r}", "model_not_found")
    return serving(state, state.generation)


def _params(runtime: GenerationRuntime, body: _Sampling, prompt_tokens: int, asked: int | None) -> SamplingParams:
    room = runtime.context - prompt_tokens
    if (asked is not None and prompt_tokens + asked > runtime.context) or room < 1:
        wanted = prompt_tokens + (asked or 1)
        raise ApiError(400, f"This model's maximum context length is {runtime.context} tokens. However, you "
                            f"requested {wanted} tokens ({prompt_tokens} in the prompt, {asked or 1} in the "
                            "completion). Shorten the prompt or lower max_tokens.", "context_length_exceeded")
    if body.min_tokens > (asked or room):
        raise ApiError(400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({asked or room})", "invalid_request")
    return SamplingParams(
        max_tokens=asked or room, temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
        seed=body.seed, repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, stop=body.stops(), stop_token_ids=tuple(body.stop_token_ids),
        ignore_eos=body.ignore_eos, min_tokens=body.min_tokens)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _merged(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave several choices' deltas as they come (n > 1)."""
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Delta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
            await queue.put((index, None))
        except BaseException as exc:  # surfaced to the consumer below
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


def _start(runtime: GenerationRuntime, prompt: list[int], params: SamplingParams, n: int) -> list[AsyncIterator[Delta]]:
    try:
        return [generate(runtime.scheduler, runtime.tokenizer, prompt, params) for _ in range(n)]
    except SchedulerFull as exc:
        raise overloaded() from exc


class _Run:
    """One API call's generations: a single prompt with n choices, or several prompts (completions)."""

    def __init__(self, runtime: GenerationRuntime, prompts: list[list[int]], params: list[SamplingParams],
                 n: int) -> None:
        self.prompt_tokens = sum(len(p) for p in prompts)  # OpenAI counts a prompt once, whatever n is
        self.streams: list[AsyncIterator[Delta]] = []
        for prompt, p in zip(prompts, params, strict=True):
            self.streams += _start(runtime, prompt, p, n)
        self.text = [""] * len(self.streams)
        self.finish: list[str | None] = [None] * len(self.streams)
        self.tokens = [0] * len(self.streams)

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        async for index, delta in _merged(self.streams):
            self.text[index] += delta.text
            self.tokens[index] = delta.completion_tokens
            if delta.finish:
                self.finish[index] = delta.finish
            yield index, delta

    async def complete(self, request: Request, timeout: float) -> None:
        """Run to the end, cancelling everything if the client goes away or the time runs out."""
        work = asyncio.create_task(self._drain())
        deadline = time.monotonic() + timeout
        while not work.done():
            done, _ = await asyncio.wait({work}, timeout=0.5)
            if not done and time.monotonic() > deadline:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise timed_out(timeout)
            if not done and await request.is_disconnected():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise ApiError(499, "the client closed the request", "client_closed")
        await work

    async def _drain(self) -> None:
        async for _ in self.deltas():
            pass


def _sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _stream(run: _Run, chunk: Any, include_usage: bool) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        try:
            for head in chunk.first():
                yield _sse(head)
            async for index, delta in run.deltas():
                if delta.text:
                    yield _sse(chunk.piece(index, delta.text, None))
                if delta.finish:
                    yield _sse(chunk.piece(index, "", delta.finish))
            if include_usage:
                yield _sse(chunk.usage(_usage(run.prompt_tokens, sum(run.tokens))))
            yield _sse("[DONE]")
        except RuntimeError as exc:  # the engine failed mid-stream: say so in the stream, then end it
            yield _sse({"error": {"message": str(exc), "type": "server_error", "code": "generation_failed"}})

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _ChatChunks:
    def __init__(self, ident: str, model: str, created: int, n: int) -> None:
        self.base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
        self.n = n

    def first(self) -> list[dict[str, Any]]:
        return [{**self.base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}]} for i in range(self.n)]

    def piece(self, index: int, text: str, finish: str | None) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {**self.base, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}


class _CompletionChunks:
    def __init__(self, ident: str, model: str, created: int) -> None:
        self.base = {"id": ident, "object": "text_completion", "created": created, "model": model}

    def first(self) -> list[dict[str, Any]]:
        return []

    def piece(self, index: int, text: str, finish: str | None) -> dict[str, Any]:
        return {**self.base, "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}


async def _begin(request: Request, kind: type[Body]) -> tuple[ServiceState, Body, GenerationRuntime]:
    """Auth, then the parsed body, then the runtime it names: every generation route starts so."""
    state: ServiceState = request.app.state.service
    check_bearer(request, state.settings.api_key)
    body = await parse_body(request, kind)
    return state, body, _runtime(state, body)


async def _respond(request: Request, state: ServiceState, body: _Sampling, run: _Run, chunks: Any,
                   whole: Callable[[], dict[str, Any]]) -> Any:
    """Stream the run as SSE chunks when asked; else wait for all of it and answer once, usage added."""
    if body.stream:
        return _stream(run, chunks, bool(body.stream_options and body.stream_options.include_usage))
    await run.complete(request, state.settings.request_timeout)
    state.metrics.inc("tokens_total", sum(run.tokens), kind="completion")
    return JSONResponse({**whole(), "usage": _usage(run.prompt_tokens, sum(run.tokens))})


@router.post("/v1/chat/completions", tags=["inference"], openapi_extra=openapi_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Any:
    state, body, runtime = await _begin(request, ChatCompletionRequest)
    if body.logprobs:
        raise ApiError(400, "logprobs are not supported by this server", "unsupported_parameter")
    if body.tools:
        raise ApiError(400, "tool calls are not supported by this server", "unsupported_parameter")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise ApiError(400, "only response_format {'type': 'text'} is supported", "unsupported_parameter")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        prompt = await asyncio.to_thread(runtime.encode_chat, messages)
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), "invalid_messages") from exc
    params = _params(runtime, body, len(prompt), body.max_completion_tokens or body.max_tokens)
    run = _Run(runtime, [prompt], [params], body.n)
    ident, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.served_names()[0]
    return await _respond(request, state, body, run, _ChatChunks(ident, model, created, body.n), lambda: {
        "id": ident, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": run.text[i]}, "logprobs": None,
                     "finish_reason": run.finish[i]} for i in range(len(run.text))],
    })


def _prompts(runtime: GenerationRuntime, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompt, str):
        return [runtime.encode(prompt)]
    if not prompt:
        raise ApiError(400, "'prompt' is empty", "empty_input")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    if all(isinstance(p, str) for p in prompt):
        return [runtime.encode(p) for p in prompt]  # type: ignore[arg-type]
    return [list(p) for p in prompt]  # type: ignore[arg-type]


@router.post("/v1/completions", tags=["inference"], openapi_extra=openapi_body(CompletionRequest))
async def completions(request: Request) -> Any:
    state, body, runtime = await _begin(request, CompletionRequest)
    if body.echo or body.suffix or body.logprobs:
        raise ApiError(400, "echo, suffix and logprobs are not supported by this server", "unsupported_parameter")
    prompts = await asyncio.to_thread(_prompts, runtime, body.prompt)
    vocab = runtime.engine.config.dimensions
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ApiError(400, f"prompt {index} is empty", "empty_input")
        if vocab and any(not 0 <= t < vocab for t in prompt):
            raise ApiError(400, f"prompt {index} holds token ids outside 0..{vocab - 1}", "invalid_token_id")
    params = [_params(runtime, body, len(p), body.max_tokens) for p in prompts]
    run = _Run(runtime, prompts, params, body.n)
    ident, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), state.served_names()[0]
    return await _respond(request, state, body, run, _CompletionChunks(ident, model, created), lambda: {
        "id": ident, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": run.text[i], "logprobs": None, "finish_reason": run.finish[i]}
                    for i in range(len(run.text))],
    })
