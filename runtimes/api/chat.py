"""POST /v1/chat/completions: messages through the model's chat template, with tools and structured output."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request

from runtimes.api.admission import generation_runtime, off_loop, served
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.completion_shapes import ChatChunks, chat_logprobs, chat_message
from runtimes.api.completions import admit_run, checked_sampling, respond
from runtimes.api.errors import ApiError, OpenAIRoute
from runtimes.api.schemas_generation import ChatCompletionRequest
from runtimes.api.structured import check_tool_results, compile_constraint, guide_spec, tool_use, tools_for_template
from runtimes.generation.chat_template import ChatTemplateError
from runtimes.generation.guided import GuideSpec
from runtimes.generation.reply import ReplyFormat
from runtimes.ids import hex_id

router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])


@router.post("/v1/chat/completions", tags=["inference"], openapi_extra=openapi_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Any:
    state = served(request)
    body = await parse_body(request, ChatCompletionRequest)
    runtime = generation_runtime(state, body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "invalid_request")
    top = (body.top_logprobs or 0) if body.logprobs else None
    # <|return|> and <|call|> end a harmony reply, whatever the bundle's eos ids are
    sampling = checked_sampling(body, body.max_completion_tokens or body.max_tokens, (top, None),
                                runtime.harmony.stops if runtime.harmony is not None else ())
    check_tool_results(body.messages)
    tools = tool_use(body, runtime)
    constraint: tuple[str, GuideSpec | str] | None = guide_spec(body)
    if tools is not None and tools.forced is not None:
        if constraint is not None:
            raise ApiError(400, f"'tool_choice' requires a tool call, which {constraint[0]!r} contradicts; send one",
                           "conflicting_constraints")
        constraint = ("tools", tools.forced)
    if runtime.harmony is not None and body.chat_template_kwargs:
        raise ApiError(400, "this model's (gpt-oss's) prompt is rendered by openai-harmony, not by a chat template, so "
                            "'chat_template_kwargs' would reach nothing: remove it (reasoning_effort sets harmony's "
                            "reasoning)", "unsupported_parameter")
    if runtime.harmony is not None and constraint is not None:
        raise ApiError(400, f"this model (gpt-oss) writes its reply in harmony's channels, and {constraint[0]!r} "
                            "would constrain all of it, which this server does not do for harmony yet: send the "
                            "request without it", "unsupported_parameter")
    grammar = await compile_constraint(runtime, constraint)
    messages = [m.for_template() for m in body.messages]
    try:
        prompt, opened = await off_loop(runtime.chat_prompt, messages, tools_for_template(body),
                                        body.chat_template_kwargs, body.reasoning_effort,
                                        size=sum(len(m["content"]) for m in messages))
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), "invalid_messages") from exc
    # Markers may be special tokens ([TOOL_CALLS]): they stay in the text for the readers, no other special token does
    markers = runtime.marker_ids(tools is not None)
    run = admit_run(runtime, sampling.serving(grammar, markers), body.n, [prompt])
    ident, created, model = f"chatcmpl-{hex_id()}", int(time.time()), state.served_names()[0]
    # A constrained reply is the answer the constraint asked for: no reasoning is read out of it.
    reply = ReplyFormat(tools.form if tools else None, runtime.thinks and grammar is None, opened, runtime.harmony,
                        calls=tools is not None)
    keep = body.include_reasoning
    chunks = ChatChunks(ident, model, created, body.n, runtime.tokenizer, reply, keep)

    def whole() -> dict[str, Any]:
        choices = []
        for i, text in enumerate(run.text):
            message, finish, logprobs = chat_message(text, run.token_ids[i], reply, run.finish[i], keep,
                                                     (run.logprobs[i], run.ends[i]))
            choices.append({"index": i, "message": message, "finish_reason": finish,
                            "logprobs": chat_logprobs(runtime.tokenizer, logprobs) if body.logprobs else None})
        return {"id": ident, "object": "chat.completion", "created": created, "model": model, "choices": choices}

    return await respond(request, body, run, chunks, whole)
