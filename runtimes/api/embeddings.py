"""POST /v1/embeddings in the OpenAI shape."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Depends, Request

from runtimes.api.admission import batched, embedding_runtime, encoded, served
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.errors import ApiError, OpenAIRoute
from runtimes.api.schemas import (
    INPUT_PROMPTS,
    MAX_INPUTS,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    Usage,
)
from runtimes.bundle.engine import EncoderOptions
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


def prompt_for(options: EncoderOptions, name: str | None, input_type: str | None) -> str:
    """The prefix a request's texts get: the prompt it names, the one its input_type means, or the default."""
    if name is not None and input_type is not None:
        raise ApiError(400, "send either 'prompt_name' or 'input_type', not both", "invalid_request")
    if name is not None and name not in options.prompts:
        named = ", ".join(map(repr, sorted(options.prompts))) or "none"
        raise ApiError(400, f"prompt_name {name[:64]!r} is not one of this model's prompts ({named})",
                       "unknown_prompt")
    if input_type is not None:
        name = next((n for n in INPUT_PROMPTS[input_type] if n in options.prompts), None)
        return options.prompts[name] if name is not None else ""
    return options.prompt(name)


def check_dimensions(options: EncoderOptions, asked: int | None) -> int | None:
    """The width to cut the vectors to (None: leave them whole); a 400 for a width the model was not trained for."""
    full = options.embedding_dim
    if asked is None or asked == full:
        return None
    if not options.matryoshka:
        raise ApiError(400, f"this model returns {full} dimensions and was not trained to be cut shorter "
                            f"(Matryoshka); 'dimensions' must be {full} or left out", "unsupported_dimensions")
    allowed = options.matryoshka_dims
    if asked > full or (allowed and asked not in allowed):
        widths = ", ".join(map(str, allowed)) if allowed else f"1..{full}"
        raise ApiError(400, f"'dimensions' must be one of {widths} for this model", "unsupported_dimensions")
    return asked


def shortened(vectors: np.ndarray, width: int, normalize: bool) -> np.ndarray:
    """A Matryoshka embedding's first `width` values, unit length again where the model's vectors are."""
    cut = np.ascontiguousarray(vectors[:, :width])
    if normalize:
        cut /= np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)
    return cut


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

    if ids:
        return await batched(request, runtime.batcher, ids), sum(len(s) for s in ids)
    return await encoded(request, runtime.batcher, texts, [len(t) for t in texts],
                         lambda chunk: runtime.tokenizer.encode(chunk, truncate), too_long)


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
    prefix = prompt_for(runtime.engine.config.encoder, body.prompt_name, body.input_type)
    texts = [prefix + text for text in texts] if prefix else texts
    width = check_dimensions(runtime.engine.config.encoder, body.dimensions)
    vectors, tokens = await embed(request, runtime, texts, body.truncate, hint, ids)
    if width is not None:
        vectors = shortened(vectors, width, runtime.engine.config.encoder.normalize)
    data = [EmbeddingData(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingResponse(data=data, model=state.served_names()[0],
                             usage=Usage(prompt_tokens=tokens, total_tokens=tokens))
