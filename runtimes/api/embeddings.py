"""POST /v1/embeddings in the OpenAI shape."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Depends, Request

from runtimes.api.admission import batched, embedding_runtime, served, tokenized
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.errors import ApiError, OpenAIRoute
from runtimes.api.schemas import MAX_INPUTS, EmbeddingData, EmbeddingRequest, EmbeddingResponse, Usage
from runtimes.state import EmbeddingRuntime, ServiceState
from runtimes.tokenize import InputTooLong, Truncate

router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])


def check_texts(texts: list[str], where: str = "input") -> None:
    """The bounds every embedding request keeps, whichever API it came through."""
    if not texts:
        raise ApiError(400, f"'{where}' must hold at least one text", "empty_input")
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"'{where}' holds {len(texts)} texts; at most {MAX_INPUTS} per request",
                       "too_many_inputs")
    for index, text in enumerate(texts):
        if not text:
            raise ApiError(400, f"{where} {index} is an empty string", "empty_input")


def checked_ids(runtime: EmbeddingRuntime, seqs: list[list[int]], truncate: Truncate, hint: str) -> list[list[int]]:
    """Token-id inputs bounded as texts are: at least one, at most MAX_INPUTS, ids in the vocabulary, each
    within the model's limit or truncated as asked."""
    if len(seqs) > MAX_INPUTS:
        raise ApiError(400, f"'input' holds {len(seqs)} inputs; at most {MAX_INPUTS} per request", "too_many_inputs")
    vocab, limit = runtime.tokenizer.vocab_size, runtime.tokenizer.max_length
    out = []
    for index, ids in enumerate(seqs):
        if not ids:
            raise ApiError(400, f"input {index} holds no token ids", "empty_input")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ApiError(400, f"input {index} holds token ids outside 0..{vocab - 1}", "invalid_token_id")
        if len(ids) > limit and truncate == "NONE":
            raise ApiError(400, f"input {index} has {len(ids)} tokens; this model takes at most {limit}; shorten "
                                f"it or {hint}", "input_too_long")
        out.append(ids[:limit] if truncate == "END" else ids[-limit:])
    return out


async def embed(request: Request, runtime: EmbeddingRuntime, texts: list[str], truncate: Truncate,
                hint: str, ids: list[list[int]] | None = None) -> tuple[np.ndarray, int]:
    """Tokenize (unless `ids` are given), queue, and wait (under the deadline, cancelled if the client leaves):
    vectors and tokens."""
    def too_long(index: int, exc: InputTooLong) -> ApiError:
        return ApiError(400, f"input {index} has {exc.tokens} tokens; this model takes at most {exc.limit}; "
                             f"shorten it or {hint}", "input_too_long")

    seqs = ids or await tokenized(request, texts, lambda chunk: runtime.tokenizer.encode_async(chunk, truncate),
                                  too_long)
    return await batched(request, runtime.batcher, seqs), sum(len(s) for s in seqs)


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


@router.post("/v1/embeddings", tags=["inference"], response_model=EmbeddingResponse,
             openapi_extra=openapi_body(EmbeddingRequest))
async def embeddings(request: Request) -> EmbeddingResponse:
    state: ServiceState = served(request)
    body = await parse_body(request, EmbeddingRequest)
    runtime = embedding_runtime(state, body.model)
    try:
        ids = body.token_ids()
    except ValueError as exc:
        raise ApiError(400, str(exc), "invalid_input") from exc
    hint = 'send "truncate": "END"'
    texts = [] if ids is not None else body.texts()
    if ids is None:
        check_texts(texts)
    else:
        ids = checked_ids(runtime, ids, body.truncate, hint)
    dims = runtime.engine.config.encoder.embedding_dim
    if body.dimensions is not None and body.dimensions != dims:
        raise ApiError(400, f"this model returns {dims} dimensions; 'dimensions' must be {dims} or left out",
                       "unsupported_dimensions")
    vectors, tokens = await embed(request, runtime, texts, body.truncate, hint, ids)
    data = [EmbeddingData(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingResponse(data=data, model=state.served_names()[0],
                             usage=Usage(prompt_tokens=tokens, total_tokens=tokens))
