"""A cross-encoder made at test time goes through the whole pipeline into a Docker image, and the clients a RAG stack
already uses read its answers: the Cohere SDK's v1 and v2 rerank (what LangChain's and LlamaIndex's Cohere
rerankers call), plain HTTP on NIM's /v1/ranking and vLLM's /v1/score, and tritonclient on KServe V2. The model is
tests/support/tiny_models.py's cross-encoder trained on a rule the test knows, so "the right order" is known as
well as the scores, which must be sentence-transformers' CrossEncoder's within 1e-4 (fp32). No real cross-encoder
can be had offline here (no Hub access; no wheel carries one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from sentence_transformers import CrossEncoder

from tests.integration.conftest import BASE_IMAGE
from tests.support.containers import docker
from tests.support.procs import mbuild
from tests.support.runners import docker_run
from tests.support.tiny_models import TOPICS, make_tiny_cross_encoder

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TAG = "mbuild-test/tiny-reranker:it"
QUERY = "docker"  # topic 1
DOCS = ["the quick brown dog jumps over", "vector python token batch serve health",
        "lazy world model image hello container", "engine profile cosine build ready text",
        " ".join(TOPICS[0] * 10)]  # the last is cut to the pair limit (longest first), as the reference cuts it


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_cross_encoder(tmp_path_factory.mktemp("cross-encoder"), seed=3)


@pytest.fixture(scope="module")
def url(model: Path, docker_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    docker("rmi", "-f", TAG)
    out = tmp_path_factory.mktemp("rerank-image")
    result = mbuild("package", str(model), "--backend", "docker", "--base-image", BASE_IMAGE,
                    "--name", TAG.split(":")[0], "--version", "it", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "(rerank)" in result.stderr and "onnxruntime-cpu" in result.stderr and "fp32" in result.stderr
    with docker_run(TAG) as served:
        yield served
    docker("rmi", "-f", TAG)


@pytest.fixture(scope="module")
def logits(model: Path) -> np.ndarray:
    reference = CrossEncoder(str(model), device="cpu", max_length=64)
    return np.asarray(reference.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity(),
                                        show_progress_bar=False), dtype=np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-x)))


def test_the_order_is_the_rule_the_model_learned(logits: np.ndarray) -> None:
    """The reference itself ranks the query's topic first: otherwise "the right order" below would mean nothing."""
    assert set(np.argsort(-logits)[:2]) == {1, 3}


def test_cohere_sdk_v1_and_v2_read_the_rerank(url: str, logits: np.ndarray) -> None:
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    want = sigmoid(logits)
    with httpx.Client(timeout=30) as http:  # the SDK's own client would be left open
        v1 = cohere.Client(api_key="unused", base_url=url, httpx_client=http).rerank(
            model=name, query=QUERY, documents=DOCS, top_n=3, return_documents=True)
        v2 = cohere.ClientV2(api_key="unused", base_url=url, httpx_client=http).rerank(
            model=name, query=QUERY, documents=DOCS)
    assert [r.index for r in v1.results] == list(np.argsort(-logits)[:3])
    for result in v1.results:
        assert abs(result.relevance_score - want[result.index]) < 1e-4
        assert result.document is not None and result.document.text == DOCS[result.index]
    assert [r.index for r in v2.results] == list(np.argsort(-logits))
    assert np.allclose([r.relevance_score for r in v2.results], want[np.argsort(-logits)], atol=1e-4)


def test_nim_ranking_and_vllm_score_over_http(url: str, logits: np.ndarray) -> None:
    ranking = httpx.post(f"{url}/v1/ranking", json={"query": {"text": QUERY}, "passages": [{"text": d} for d in DOCS],
                                                    "truncate": "END"}).json()["rankings"]
    assert [r["index"] for r in ranking] == list(np.argsort(-logits))
    assert np.allclose([r["logit"] for r in ranking], logits[np.argsort(-logits)], atol=1e-4)
    scores = httpx.post(f"{url}/v1/score", json={"text_1": QUERY, "text_2": DOCS, "truncate": "END"}).json()["data"]
    assert np.allclose([s["score"] for s in scores], sigmoid(logits), atol=1e-4)


def test_tritonclient_reads_kserve_v2(url: str, logits: np.ndarray) -> None:
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    query, passages = triton.InferInput("query", [1], "BYTES"), triton.InferInput("passages", [len(DOCS)], "BYTES")
    query.set_data_from_numpy(np.array([QUERY.encode()], dtype=object))
    passages.set_data_from_numpy(np.array([d.encode() for d in DOCS], dtype=object))
    result = client.infer(name, [query, passages], parameters={"truncate": "END"},
                          outputs=[triton.InferRequestedOutput("logit", binary_data=True)])
    got = result.as_numpy("logit")
    assert got is not None and np.allclose(got, logits, atol=1e-4)
