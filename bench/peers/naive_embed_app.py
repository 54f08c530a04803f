"""The embedding server a user would write instead: FastAPI around sentence-transformers' `encode`.

One request, one `encode` call, in FastAPI's thread pool; no batching across requests. The model folder,
the backend (torch, or onnx: sentence-transformers' own ONNX Runtime backend) and the thread count come
from the environment. Run with uvicorn: `uvicorn bench.peers.naive_embed_app:app`.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import torch
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

THREADS = int(os.environ.get("BENCH_THREADS", "1"))
BACKEND = os.environ.get("BENCH_BACKEND", "torch")
torch.set_num_threads(THREADS)


def _load() -> SentenceTransformer:
    kwargs: dict[str, Any] = {}
    if BACKEND == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()  # the same thread count as every other arm
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
    backend: Literal["torch", "onnx"] = "onnx" if BACKEND == "onnx" else "torch"
    return SentenceTransformer(os.environ["BENCH_MODEL_DIR"], device="cpu", backend=backend, model_kwargs=kwargs)


model = _load()
app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/embeddings")
def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
    texts = [body.input] if isinstance(body.input, str) else body.input
    vectors = model.encode(texts, batch_size=len(texts))
    return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                       for i, v in enumerate(vectors)]}
