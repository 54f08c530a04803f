"""The naive baseline of the served-LLM benchmark: the server a user writes around `transformers` in an hour.

FastAPI, `model.generate` in a thread feeding a TextIteratorStreamer, one generation at a time under a lock,
OpenAI-style SSE on POST /v1/completions. BENCH_MODEL_DIR names the model folder, BENCH_THREADS the
intra-op thread count. Run it with `uvicorn bench.peers.naive_llm_app:app`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

MODEL_DIR = os.environ["BENCH_MODEL_DIR"]
STALL_SECONDS = 300.0  # a stream that gets no token for this long ends instead of hanging its client

torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
model = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
lock = threading.Lock()  # one generation at a time: no batching, the rest wait their turn
app = FastAPI()


class Completion(BaseModel):
    prompt: str
    max_tokens: int = 16
    min_tokens: int = 0
    stream: bool = True


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _generate(body: Completion, streamer: TextIteratorStreamer) -> None:
    inputs = tokenizer(body.prompt, return_tensors="pt")
    try:
        with lock, torch.no_grad():
            model.generate(**inputs, streamer=streamer, max_new_tokens=body.max_tokens,
                           min_new_tokens=body.min_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    except Exception:
        streamer.end()  # let the response finish instead of waiting for tokens that never come
        raise


def _events(body: Completion) -> Iterator[str]:
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=STALL_SECONDS)
    threading.Thread(target=_generate, args=(body, streamer), daemon=True).start()
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": MODEL_DIR}
    for text in streamer:
        if text:
            yield _sse({**base, "choices": [{"index": 0, "text": text, "finish_reason": None}]})
    yield _sse({**base, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    yield _sse("[DONE]")


@app.post("/v1/completions")
def completions(body: Completion) -> StreamingResponse:
    return StreamingResponse(_events(body), media_type="text/event-stream")


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}
