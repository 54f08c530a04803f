"""KServe V2 / Open Inference Protocol routes, as tritonclient[http] speaks them.

Embedding models take "text" (BYTES [N]) or raw "input_ids" + "attention_mask" (INT64 [N, S]) and
return "embedding" (FP32 [N, dims]); rerankers take "query" (BYTES [1]) and "passages" (BYTES [N]) and return
"score" (FP32 [N], the relevance score) and "logit" (FP32 [N]), in the passages' order; language models take
"text_input" (BYTES [N]) and optional "max_tokens" and return "text_output" (BYTES [N]). Errors are
{"error": "..."} with Triton's codes: 400 for a bad request, 404 for an unknown model, 503 while not ready, 429 when
the queue is full.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from starlette.responses import Response

from runtimes import __version__
from runtimes.api.admission import (
    batched,
    check_model,
    embedding_runtime,
    generation_runtime,
    off_loop,
    rerank_runtime,
    run_to_end,
    served,
)
from runtimes.api.auth import require_key
from runtimes.api.bodies import describe, read_body
from runtimes.api.completions import Run, check_sequences, checked_sampling
from runtimes.api.embeddings import check_texts, embed
from runtimes.api.errors import ApiError, V2Route, generation_failed
from runtimes.api.kserve_codec import HEADER, InferRequest, TensorError, encode_response, parse_infer
from runtimes.api.rerank import relevance, score_pairs
from runtimes.api.schemas import MAX_INPUTS
from runtimes.api.schemas_generation import CompletionRequest
from runtimes.generation.stream import GenerationFailed
from runtimes.state import ServiceState
from runtimes.tokenize import Truncate

TRUNCATE: dict[str, Truncate] = {"NONE": "NONE", "START": "START", "END": "END"}
# Probes stay open for load balancers and kubelets; everything else needs the key when one is set.
probes = APIRouter(prefix="/v2", tags=["kserve-v2"], route_class=V2Route)
router = APIRouter(prefix="/v2", tags=["kserve-v2"], route_class=V2Route, dependencies=[Depends(require_key)])


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> ApiError:
    return ApiError(status, message, "kserve_error", headers=headers)


def _ready(state: ServiceState) -> bool:
    return state.health.serving and (state.embedding or state.ranking or state.generation) is not None


@router.get("")
async def server_metadata() -> dict[str, Any]:
    return {"name": "mbuild", "version": __version__, "extensions": ["binary_tensor_data"]}


@probes.get("/health/live")
async def live() -> Response:
    return Response(status_code=200)


@probes.get("/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if served(request).health.ready else 503)


def _io(state: ServiceState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    config = state.config
    if config is None:
        return [], []
    if config.task == "embedding":
        return ([{"name": "text", "datatype": "BYTES", "shape": [-1]},
                 {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                 {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}],
                [{"name": "embedding", "datatype": "FP32", "shape": [-1, config.encoder.embedding_dim]}])
    if config.task == "rerank":
        return ([{"name": "query", "datatype": "BYTES", "shape": [1]},
                 {"name": "passages", "datatype": "BYTES", "shape": [-1]}],
                [{"name": "score", "datatype": "FP32", "shape": [-1]},
                 {"name": "logit", "datatype": "FP32", "shape": [-1]}])
    return ([{"name": "text_input", "datatype": "BYTES", "shape": [-1]},
             {"name": "max_tokens", "datatype": "INT32", "shape": [-1]}],
            [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}])


@router.post("/models/{model:path}/infer")
async def infer(model: str, request: Request) -> Response:
    state = served(request)
    body = await read_body(request)
    try:
        parsed = parse_infer(body, request.headers.get(HEADER))
    except TensorError as exc:
        raise _error(400, str(exc)) from exc
    if state.generation is not None:
        outputs = await _generate(request, state, parsed, model)
    elif state.ranking is not None:
        outputs = await _rank(request, state, parsed, model)
    else:
        outputs = await _embed(request, state, parsed, model)
    content, headers = encode_response(state.served_names()[0], parsed, outputs)
    return Response(content, headers=headers)


def _check_outputs(state: ServiceState, parsed: InferRequest) -> None:
    expected = {o["name"] for o in _io(state)[1]}
    unknown = set(parsed.binary_outputs) - expected
    if unknown:
        raise _error(400, f"unknown output(s) {sorted(unknown)[:8]}; this model returns {sorted(expected)}")


def _texts(parsed: InferRequest, name: str, empty: bool = False) -> list[str]:
    array = parsed.inputs[name]
    if array.dtype != object or array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        raise _error(400, f"input {name!r} must be BYTES with shape [N] or [N, 1]")
    try:
        texts = [v.decode("utf-8") for v in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise _error(400, f"input {name!r} holds bytes that are not UTF-8 text") from exc
    if not empty:
        check_texts(texts, name)
    elif not 1 <= len(texts) <= MAX_INPUTS:
        raise _error(400, f"input {name!r} must hold 1..{MAX_INPUTS} texts")
    return texts


async def _embed(request: Request, state: ServiceState, parsed: InferRequest,
                 model: str) -> dict[str, tuple[np.ndarray, str]]:
    runtime = embedding_runtime(state, model)
    _check_outputs(state, parsed)
    if "text" in parsed.inputs:
        texts = _texts(parsed, "text")
        truncate = parsed.parameters.get("truncate", "NONE")
        if not isinstance(truncate, str) or truncate.upper() not in TRUNCATE:
            raise _error(400, "parameter 'truncate' must be NONE, START or END")
        vectors, _ = await embed(request, runtime, texts, TRUNCATE[truncate.upper()],
                                 'send the parameter "truncate": "END"')
    elif "input_ids" in parsed.inputs and "attention_mask" in parsed.inputs:
        seqs = _raw_sequences(parsed, runtime.tokenizer.max_length, runtime.tokenizer.vocab_size)
        vectors = await batched(request, runtime.batcher, seqs)
    else:
        raise _error(400, "this model takes input 'text' (BYTES [N]) or 'input_ids' and 'attention_mask' "
                          "(INT64 [N, S])")
    return {"embedding": (np.asarray(vectors, dtype=np.float32), "FP32")}


async def _rank(request: Request, state: ServiceState, parsed: InferRequest,
                model: str) -> dict[str, tuple[np.ndarray, str]]:
    runtime = rerank_runtime(state, model)
    _check_outputs(state, parsed)
    if "query" not in parsed.inputs or "passages" not in parsed.inputs:
        raise _error(400, "this model takes inputs 'query' (BYTES [1]) and 'passages' (BYTES [N])")
    query, passages = _texts(parsed, "query"), _texts(parsed, "passages", empty=True)
    if len(query) != 1:
        raise _error(400, f"input 'query' holds {len(query)} texts; send one")
    truncate = parsed.parameters.get("truncate", "NONE")
    if truncate not in ("NONE", "END"):
        raise _error(400, "parameter 'truncate' must be NONE or END")
    logits, _ = await score_pairs(request, runtime, [(query[0], p) for p in passages], TRUNCATE[str(truncate)],
                                  'send the parameter "truncate": "END"')
    return {"score": (relevance(runtime, logits).astype(np.float32), "FP32"),
            "logit": (np.asarray(logits, dtype=np.float32), "FP32")}


def _raw_sequences(parsed: InferRequest, limit: int, vocab: int) -> list[list[int]]:
    ids, mask = parsed.inputs["input_ids"], parsed.inputs["attention_mask"]
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        if array.ndim != 2 or array.dtype.kind not in "iu":
            raise _error(400, f"input {name!r} must be INT64 (or INT32) with shape [N, S]")
    if ids.shape != mask.shape or 0 in ids.shape:
        raise _error(400, f"input_ids {list(ids.shape)} and attention_mask {list(mask.shape)} must share a "
                           "non-empty shape")
    if ids.shape[1] > limit:
        raise _error(400, f"sequences of {ids.shape[1]} tokens exceed this model's {limit}")
    if ids.min() < 0 or ids.max() >= vocab or not np.isin(mask, (0, 1)).all():
        raise _error(400, f"input_ids must lie in 0..{vocab - 1} and attention_mask hold only 0 and 1")
    if ids.shape[0] > MAX_INPUTS:  # the same cap on rows as on texts
        raise _error(400, f"input_ids holds {ids.shape[0]} rows; at most {MAX_INPUTS} per request")
    seqs = [row[m == 1].astype(np.int64).tolist() for row, m in zip(ids, mask, strict=True)]
    if any(not s for s in seqs):
        raise _error(400, "every row needs at least one token with attention_mask 1")
    return seqs


async def _generate(request: Request, state: ServiceState, parsed: InferRequest,
                    model: str) -> dict[str, tuple[np.ndarray, str]]:
    runtime = generation_runtime(state, model)
    _check_outputs(state, parsed)
    if "text_input" not in parsed.inputs:
        raise _error(400, "this model takes input 'text_input' (BYTES [N]) and an optional 'max_tokens'")
    texts = _texts(parsed, "text_input")
    check_sequences(runtime, len(texts), "rows of text_input")
    asked = parsed.inputs.get("max_tokens")
    if asked is not None and asked.dtype.kind not in "iu":
        raise _error(400, "max_tokens must be INT32 or INT64")
    limits = [int(v) for v in asked.reshape(-1)] if asked is not None else [16]
    if len(limits) not in (1, len(texts)) or any(not 1 <= v <= runtime.context for v in limits):
        raise _error(400, f"max_tokens must lie in 1..{runtime.context}, one value or one per text_input")
    try:  # the same bounds as the OpenAI routes' fields
        body = CompletionRequest.model_validate(
            {"prompt": "", **{k: v for k, v in parsed.parameters.items() if k in ("temperature", "top_p")}})
    except ValidationError as exc:
        raise _error(400, describe(exc)) from exc
    checks = [checked_sampling(body, limit) for limit in limits]
    prompts = await off_loop(lambda: [runtime.encode(text) for text in texts], size=sum(map(len, texts)))
    jobs = [(prompt, checks[i % len(checks)].fit(runtime.context, len(prompt), i)) for i, prompt in enumerate(prompts)]
    run = Run(runtime, jobs, sum(map(len, prompts)))  # every prompt enters, or none does
    try:
        await run_to_end(request, run.drain(), state.settings.request_timeout, run.started)
    except GenerationFailed as exc:
        raise generation_failed(exc) from exc
    return {"text_output": (np.array([t.encode() for t in run.text], dtype=object), "BYTES")}


@probes.get("/models/{model:path}/ready")
async def model_ready(model: str, request: Request) -> Response:
    state = served(request)
    check_model(state, model)
    return Response(status_code=200 if _ready(state) and state.health.ready else 503)


@router.get("/models/{model:path}")
async def model_metadata(model: str, request: Request) -> dict[str, Any]:
    state = served(request)
    check_model(state, model)
    inputs, outputs = _io(state)
    platform = "tensorrt_plan" if state.config and state.config.engine == "tensorrt" else "onnxruntime_onnx"
    return {"name": model, "versions": ["1"], "platform": platform, "inputs": inputs, "outputs": outputs}
