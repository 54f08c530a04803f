"""KServe V2 / Open Inference Protocol routes, as tritonclient[http] speaks them.

Embedding models take "text" (BYTES [N]) or raw "input_ids" + "attention_mask" (INT64 [N, S]) and
return "embedding" (FP32 [N, dims]); language models take "text_input" (BYTES [N]) and optional
"max_tokens" and return "text_output" (BYTES [N]). Errors are {"error": "..."} with Triton's codes:
400 for a bad request, 404 for an unknown model, 503 while not ready, 429 when the queue is full.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from runtimes import __version__
from runtimes.api.auth import check_bearer
from runtimes.api.bodies import read_limited
from runtimes.api.kserve_codec import HEADER, InferRequest, TensorError, encode_response, parse_infer
from runtimes.batcher import QueueFull
from runtimes.generation.generator import generate
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.scheduler import SchedulerFull
from runtimes.health import State
from runtimes.state import ServiceState
from runtimes.tokenize import InputTooLong, Truncate

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
TRUNCATE: dict[str, Truncate] = {"NONE": "NONE", "START": "START", "END": "END"}


class V2Error(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def _model(state: ServiceState, name: str) -> None:
    if name not in state.served_names():
        raise V2Error(404, f"unknown model {name!r}; this server serves {state.served_names()[0]!r}")


def _ready(state: ServiceState) -> bool:
    return state.health.state in (State.READY, State.DRAINING) and (state.embedding or state.generation) is not None


@router.get("")
async def server_metadata() -> dict[str, Any]:
    return {"name": "mbuild", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/health/live")
async def live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if _state(request).health.ready else 503)


def _io(state: ServiceState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    config = state.config
    if config is None:
        return [], []
    if config.task == "embedding":
        return ([{"name": "text", "datatype": "BYTES", "shape": [-1]},
                 {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                 {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}],
                [{"name": "embedding", "datatype": "FP32", "shape": [-1, config.dimensions]}])
    return ([{"name": "text_input", "datatype": "BYTES", "shape": [-1]},
             {"name": "max_tokens", "datatype": "INT32", "shape": [-1]}],
            [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}])


@router.post("/models/{model:path}/infer")
async def infer(model: str, request: Request) -> Response:
    state = _state(request)
    check_bearer(request, state.settings.api_key)
    _model(state, model)
    body = await read_limited(request, state.settings.max_body_bytes)
    try:
        parsed = parse_infer(body, request.headers.get(HEADER))
    except TensorError as exc:
        raise V2Error(400, str(exc)) from exc
    if not _ready(state):
        raise V2Error(503, f"model {model!r} is not ready ({state.health.state.value})", {"Retry-After": "5"})
    expected = {o["name"] for o in _io(state)[1]}
    unknown = set(parsed.binary_outputs) - expected
    if unknown:
        raise V2Error(400, f"unknown output(s) {sorted(unknown)}; this model returns {sorted(expected)}")
    try:
        if state.generation is not None:
            outputs = await _generate(state, parsed)
        else:
            outputs = await _embed(state, parsed)
    except (QueueFull, SchedulerFull) as exc:
        raise V2Error(429, "the server is at capacity; retry shortly", {"Retry-After": "1"}) from exc
    except TimeoutError as exc:
        raise V2Error(503, "the request timed out waiting for the engine; retry shortly", {"Retry-After": "1"}) from exc
    content, headers = encode_response(state.served_names()[0], parsed, outputs)
    return Response(content, headers=headers)


def _texts(parsed: InferRequest, name: str) -> list[str]:
    array = parsed.inputs[name]
    if array.dtype != object or array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        raise V2Error(400, f"input {name!r} must be BYTES with shape [N] or [N, 1]")
    try:
        texts = [v.decode("utf-8") for v in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise V2Error(400, f"input {name!r} holds bytes that are not UTF-8 text") from exc
    if not texts or any(not t for t in texts):
        raise V2Error(400, f"input {name!r} must hold non-empty texts")
    return texts


async def _embed(state: ServiceState, parsed: InferRequest) -> dict[str, tuple[np.ndarray, str]]:
    runtime = state.embedding
    assert runtime is not None
    limit = runtime.tokenizer.max_length
    if "text" in parsed.inputs:
        texts = _texts(parsed, "text")
        truncate = str(parsed.parameters.get("truncate", "NONE")).upper()
        if truncate not in TRUNCATE:
            raise V2Error(400, "parameter 'truncate' must be NONE, START or END")
        try:
            seqs = await runtime.tokenizer.encode_async(texts, TRUNCATE[truncate])
        except InputTooLong as exc:
            raise V2Error(400, f"{exc}; shorten it or send the parameter \"truncate\": \"END\"") from exc
    elif "input_ids" in parsed.inputs and "attention_mask" in parsed.inputs:
        seqs = _raw_sequences(parsed, limit, runtime.tokenizer.vocab_size)
    else:
        raise V2Error(400, "this model takes input 'text' (BYTES [N]) or 'input_ids' and 'attention_mask' "
                           "(INT64 [N, S])")
    vectors = await asyncio.wait_for(runtime.batcher.submit(seqs), state.settings.request_timeout)
    return {"embedding": (np.asarray(vectors, dtype=np.float32), "FP32")}


def _raw_sequences(parsed: InferRequest, limit: int, vocab: int) -> list[list[int]]:
    ids, mask = parsed.inputs["input_ids"], parsed.inputs["attention_mask"]
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        if array.ndim != 2 or array.dtype.kind not in "iu":
            raise V2Error(400, f"input {name!r} must be INT64 (or INT32) with shape [N, S]")
    if ids.shape != mask.shape or 0 in ids.shape:
        raise V2Error(400, f"input_ids {list(ids.shape)} and attention_mask {list(mask.shape)} must share a "
                           "non-empty shape")
    if ids.shape[1] > limit:
        raise V2Error(400, f"sequences of {ids.shape[1]} tokens exceed this model's {limit}")
    if ids.min() < 0 or ids.max() >= vocab or not np.isin(mask, (0, 1)).all():
        raise V2Error(400, f"input_ids must lie in 0..{vocab - 1} and attention_mask hold only 0 and 1")
    seqs = [row[m == 1].astype(np.int64).tolist() for row, m in zip(ids, mask, strict=True)]
    if any(not s for s in seqs):
        raise V2Error(400, "every row needs at least one token with attention_mask 1")
    return seqs


async def _generate(state: ServiceState, parsed: InferRequest) -> dict[str, tuple[np.ndarray, str]]:
    runtime = state.generation
    assert runtime is not None
    if "text_input" not in parsed.inputs:
        raise V2Error(400, "this model takes input 'text_input' (BYTES [N]) and an optional 'max_tokens'")
    texts = _texts(parsed, "text_input")
    asked = parsed.inputs.get("max_tokens")
    limits = [int(v) for v in asked.reshape(-1)] if asked is not None else [16]
    if len(limits) not in (1, len(texts)) or any(v < 1 for v in limits):
        raise V2Error(400, "max_tokens must be positive, one value or one per text_input")
    params = parsed.parameters
    try:
        temperature, top_p = float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0))
    except (TypeError, ValueError) as exc:
        raise V2Error(400, "parameters temperature and top_p must be numbers") from exc
    if not 0 <= temperature <= 2 or not 0 < top_p <= 1:
        raise V2Error(400, "temperature must lie in 0..2 and top_p in (0, 1]")
    streams = []
    for index, text in enumerate(texts):
        prompt = runtime.encode(text)
        wanted = limits[index % len(limits)]
        if len(prompt) + wanted > runtime.context:
            raise V2Error(400, f"prompt {index} ({len(prompt)} tokens) plus max_tokens {wanted} exceeds this "
                               f"model's context of {runtime.context} tokens")
        streams.append(generate(runtime.scheduler, runtime.tokenizer, prompt,
                                SamplingParams(max_tokens=wanted, temperature=temperature, top_p=top_p)))

    async def collect(stream: Any) -> bytes:
        return "".join([delta.text async for delta in stream]).encode()

    outputs = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), state.settings.request_timeout)
    return {"text_output": (np.array(outputs, dtype=object), "BYTES")}


@router.get("/models/{model:path}/ready")
async def model_ready(model: str, request: Request) -> Response:
    state = _state(request)
    _model(state, model)
    return Response(status_code=200 if _ready(state) and state.health.ready else 503)


@router.get("/models/{model:path}")
async def model_metadata(model: str, request: Request) -> dict[str, Any]:
    state = _state(request)
    _model(state, model)
    inputs, outputs = _io(state)
    platform = "tensorrt_plan" if state.config and state.config.engine == "tensorrt" else "onnxruntime_onnx"
    return {"name": model, "versions": ["1"], "platform": platform, "inputs": inputs, "outputs": outputs}



