"""POST /v1/embeddings in the OpenAI shape."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import APIRouter, Request

from runtimes.api.auth import check_bearer
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.errors import ApiError, overloaded, timed_out
from runtimes.api.schemas import MAX_INPUTS, EmbeddingData, EmbeddingRequest, EmbeddingResponse, Usage
from runtimes.batcher import QueueFull
from runtimes.state import EmbeddingRuntime, ServiceState, serving
from runtimes.tokenize import InputTooLong

router = APIRouter()


def _ready(state: ServiceState) -> EmbeddingRuntime:
    if state.config is not None and state.config.task != "embedding":
        raise ApiError(404, "this model generates text; it serves /v1/chat/completions and /v1/completions, "
                            "not /v1/embeddings", "wrong_task")
    return serving(state, state.embedding)


def _check_request(state: ServiceState, body: EmbeddingRequest, texts: list[str]) -> None:
    names = state.served_names()
    if body.model is not None and body.model not in names:
        raise ApiError(404, f"model {body.model!r} is not served here; use {names[0]!r}", "model_not_found")
    if not texts:
        raise ApiError(400, "'input' must hold at least one text", "empty_input")
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"'input' holds {len(texts)} texts; at most {MAX_INPUTS} per request", "too_many_inputs")
    for index, text in enumerate(texts):
        if not text:
            raise ApiError(400, f"input {index} is an empty string", "empty_input")
    dims = state.config.dimensions if state.config else None
    if body.dimensions is not None and body.dimensions != dims:
        raise ApiError(400, f"this model returns {dims} dimensions; 'dimensions' must be {dims} or left out",
                       "unsupported_dimensions")


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


@router.post("/v1/embeddings", tags=["inference"], response_model=EmbeddingResponse,
             openapi_extra=openapi_body(EmbeddingRequest))
async def embeddings(request: Request) -> EmbeddingResponse:
    state: ServiceState = request.app.state.service
    check_bearer(request, state.settings.api_key)
    body = await parse_body(request, EmbeddingRequest)
    loaded = _ready(state)
    texts = body.texts()
    _check_request(state, body, texts)
    try:
        seqs = await loaded.tokenizer.encode_async(texts, body.truncate)
    except InputTooLong as exc:
        raise ApiError(400, f"{exc}; shorten it or send \"truncate\": \"END\"", "input_too_long") from exc
    try:
        vectors = await asyncio.wait_for(loaded.batcher.submit(seqs), state.settings.request_timeout)
    except QueueFull as exc:
        raise overloaded() from exc
    except TimeoutError as exc:
        raise timed_out(state.settings.request_timeout) from exc
    tokens = sum(len(s) for s in seqs)
    state.metrics.inc("tokens_total", tokens, kind="prompt")
    data = [EmbeddingData(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingResponse(data=data, model=state.served_names()[0],
                             usage=Usage(prompt_tokens=tokens, total_tokens=tokens))
