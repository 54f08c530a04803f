"""Decoder-body embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral: a causal LM's body, last-token or mean
pooling, an instruction prompt for queries), tiny and random, through the real pipeline: gated against
sentence-transformers with and without the prompt, then served, where a request names the prompt as TEI does
(`prompt_name`) or says what its texts are as NIM and Cohere do (`input_type`). Random weights prove the export's
plumbing and fp32 exactness, not retrieval quality."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sentence_transformers import SentenceTransformer

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions
from builder.model.catalog import lookup_alias
from builder.progress import Reporter
from runtimes.bundle import load_engine_config
from tests.support.tiny_models import QWEN3_QUERY, make_tiny_decoder_embedder
from tests.unit.runtimes.api.test_generation_service import serving

pytestmark = pytest.mark.slow
TEXTS = ["what is a container image?", "Kubernetes probes decide when a pod takes traffic. " * 3, "hi"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    # Tagged as sentence-transformers' trainer tags a model trained with MatryoshkaLoss.
    model = make_tiny_decoder_embedder(tmp_path_factory.mktemp("qwen3-embedder"),
                                       card_tags=("sentence-transformers", "loss:MatryoshkaLoss"))
    build = tmp_path_factory.mktemp("qwen3-embedder-build")
    package(PackageOptions(model=str(model), output=build, backend="none"), Reporter(quiet=True))
    return model, build


@pytest.fixture(scope="module")
def client(qwen3: tuple[Path, Path]) -> Iterator[TestClient]:
    with serving(qwen3[1] / "model") as test_client:
        yield test_client


@pytest.fixture(scope="module")
def reference(qwen3: tuple[Path, Path]) -> SentenceTransformer:
    return SentenceTransformer(str(qwen3[0]), device="cpu")


def embed(client: TestClient, status: int = 200, /, **fields: Any) -> Any:
    response = client.post("/v1/embeddings", json={"input": TEXTS, **fields})
    assert response.status_code == status, response.text
    body = response.json()
    return np.array([d["embedding"] for d in body["data"]]) if status == 200 else body["error"]


def test_the_qwen3_embedder_is_built_and_gated_with_its_prompt(qwen3: tuple[Path, Path]) -> None:
    config = load_engine_config(qwen3[1] / "model")
    options = config.encoder
    assert (options.pooling, options.normalize) == ("lasttoken", True)
    assert options.prompts == {"query": QWEN3_QUERY, "document": ""} and options.default_prompt is None
    report = json.loads((qwen3[1] / "report.json").read_text())
    assert report["passed"] and report["min_cosine"] >= 0.9999
    prompted = [i for i in report["inputs"] if i["text"].startswith("Instruct:")]
    assert len(prompted) == len(report["inputs"]) // 2  # every gate text again behind the query prompt


@pytest.mark.parametrize(("fields", "prompt"), [
    ({}, None), ({"prompt_name": "query"}, "query"), ({"input_type": "query"}, "query"),
    ({"input_type": "search_query"}, "query"), ({"input_type": "passage"}, "document"),
    ({"prompt_name": "document"}, "document"),
])
def test_served_embeddings_equal_sentence_transformers(client: TestClient, reference: SentenceTransformer,
                                                       fields: dict[str, str], prompt: str | None) -> None:
    want = reference.encode(TEXTS, prompt_name=prompt)
    assert cosines(embed(client, **fields), want).min() >= 0.9999


def test_the_prompt_changes_the_vector(client: TestClient) -> None:
    assert cosines(embed(client, prompt_name="query"), embed(client)).max() < 0.9999


@pytest.mark.parametrize(("fields", "code"), [
    ({"prompt_name": "passage"}, "unknown_prompt"),
    ({"prompt_name": "query", "input_type": "query"}, "invalid_request"),
    ({"input_type": "classification"}, "invalid_request"),
])
def test_a_prompt_that_cannot_be_is_a_400(client: TestClient, fields: dict[str, str], code: str) -> None:
    error = embed(client, 400, **fields)
    assert error["code"] == code
    if code == "unknown_prompt":
        assert "'document', 'query'" in error["message"]


@pytest.mark.parametrize(("family", "pooling"), [("llama", "lasttoken"), ("mistral", "lasttoken"),
                                                  ("qwen2", "mean")])
def test_other_decoder_bodies_build_and_pass_the_gate(tmp_path: Path, family: str, pooling: str) -> None:
    model = make_tiny_decoder_embedder(tmp_path / "model", family=family, pooling=pooling)
    report = package(PackageOptions(model=str(model), output=tmp_path / "build", backend="none"),
                     Reporter(quiet=True)).report
    assert report is not None and report.passed
    assert load_engine_config(tmp_path / "build" / "model").encoder.pooling == pooling


def test_the_catalog_plans_qwen3_embedders_from_their_family() -> None:
    entry = lookup_alias("qwen3-embedding-8b")
    assert entry is not None
    facts = entry.facts()
    assert facts.task == "embedding" and facts.family == "qwen3" and facts.tied  # no LM head is served
    assert 7.0 < facts.params < 8.0  # the 8B checkpoint's body, without its LM head


def test_dimensions_cut_a_matryoshka_embedding_and_make_it_unit_again(client: TestClient,
                                                                     reference: SentenceTransformer) -> None:
    full = reference.encode(TEXTS, prompt_name="query")
    cut = embed(client, dimensions=16, prompt_name="query")
    assert cut.shape == (len(TEXTS), 16)
    assert np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    assert cosines(cut, full[:, :16]).min() >= 0.9999
    assert embed(client, 400, dimensions=10_000)["code"] == "unsupported_dimensions"
    assert embed(client, 400, dimensions=0)["code"] == "invalid_request"


def test_dimensions_are_refused_for_a_model_not_trained_for_them(tmp_path: Path) -> None:
    model = make_tiny_decoder_embedder(tmp_path / "model")  # no card: nothing says it was trained to be cut
    package(PackageOptions(model=str(model), output=tmp_path / "build", backend="none"), Reporter(quiet=True))
    with serving(tmp_path / "build" / "model") as untrained:
        error = embed(untrained, 400, dimensions=16)
    assert error["code"] == "unsupported_dimensions" and "not trained to be cut shorter" in error["message"]


def test_named_matryoshka_widths_are_the_only_ones(tmp_path: Path) -> None:
    """vLLM's signal in config.json: matryoshka_dimensions lists the widths the model was trained at."""
    model = make_tiny_decoder_embedder(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    package(PackageOptions(model=str(model), output=tmp_path / "build", backend="none"), Reporter(quiet=True))
    with serving(tmp_path / "build" / "model") as named:
        assert embed(named, dimensions=32).shape == (len(TEXTS), 32)
        assert "one of 16, 32" in embed(named, 400, dimensions=24)["message"]
