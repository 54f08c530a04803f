"""vLLM's POST /tokenize and /detokenize: the served model's own tokenizer and chat template, so a client can
count tokens (and fit a prompt to the context) exactly as the server will."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, model_validator

from runtimes.api.admission import generation_runtime, off_loop, served
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.completions import check_token_ids
from runtimes.api.errors import ApiError, OpenAIRoute
from runtimes.api.schemas_generation import MAX_MESSAGES, MAX_NAME, STRICT, ChatMessage
from runtimes.generation.chat_template import ChatTemplateError

router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])
MAX_IDS = 1 << 20


class TokenizeRequest(BaseModel):
    """A prompt, or chat messages rendered through the model's template; one of the two."""

    model_config = STRICT
    model: str | None = Field(None, max_length=MAX_NAME)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either 'prompt' or 'messages'")
        return self


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = Field(None, max_length=MAX_NAME)
    tokens: list[int] = Field(max_length=MAX_IDS)


@router.post("/tokenize", tags=["inference"], openapi_extra=openapi_body(TokenizeRequest))
async def tokenize(request: Request) -> dict[str, Any]:
    body = await parse_body(request, TokenizeRequest)
    runtime = generation_runtime(served(request), body.model)
    if body.messages is not None:
        messages = [m.for_template() for m in body.messages]
        try:
            ids = await off_loop(runtime.encode_chat, messages, body.add_generation_prompt,
                                 size=sum(len(m["content"]) for m in messages))
        except ChatTemplateError as exc:
            raise ApiError(400, str(exc), "invalid_messages") from exc
    else:
        ids = await off_loop(runtime.encode, body.prompt or "", body.add_special_tokens, size=len(body.prompt or ""))
    return {"count": len(ids), "max_model_len": runtime.context, "tokens": ids}


@router.post("/detokenize", tags=["inference"], openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request) -> dict[str, str]:
    body = await parse_body(request, DetokenizeRequest)
    runtime = generation_runtime(served(request), body.model)
    if body.tokens:
        check_token_ids(runtime, [body.tokens])
    # special tokens kept, as vLLM (transformers' decode) gives them back
    text = await off_loop(runtime.tokenizer.decode, body.tokens, False, size=len(body.tokens))
    return {"prompt": text}
