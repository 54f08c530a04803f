"""A reranker on a decoder body (Qwen3-Reranker's kind: a causal LM scored by its "yes" and "no" logits under its
model card's prompt recipe), tiny and random, through the real pipeline: detected from its card, gated against the
recipe in transformers, served on the reranking routes. The served scores are checked against the card's own code
(transformers' tokenizer, log_softmax over [no, yes] at the last position), written out here independently of the
builder's gate. Random weights prove the plumbing and fp32 exactness, not ranking quality."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions, plan_package
from builder.errors import UnsupportedModel
from builder.model.catalog import lookup_alias
from builder.model.facts import infer_task, ranks_text
from builder.model.families.qwen3 import RERANKER as QWEN3_RERANKER
from builder.progress import Reporter
from runtimes.bundle import load_engine_config
from runtimes.bundle.engine import attention_bytes
from runtimes.engines import encoder
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.hostile_rerank_cases import MAXIMAL
from tests.support.tiny_models import RANKING_CARD, make_tiny_qwen3_reranker
from tests.unit.runtimes.api.test_generation_service import serving

pytestmark = pytest.mark.slow
QUERY = "how does a container image get built?"
DOCS = ["A container image is built from a Dockerfile, layer by layer.", "The quick brown fox jumps.",
        "hello world " * 5, "Kubernetes probes decide when a pod takes traffic.", "{instruction} {0} }{"]
CAUSAL = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = make_tiny_qwen3_reranker(tmp_path_factory.mktemp("qwen3-reranker"))
    build = tmp_path_factory.mktemp("qwen3-reranker-build")
    package(PackageOptions(model=str(model), output=build, backend="none"), Reporter(quiet=True))
    return model, build


@pytest.fixture(scope="module")
def client(reranker: tuple[Path, Path]) -> Iterator[TestClient]:
    with serving(reranker[1] / "model") as test_client:
        yield test_client


def card_scores(model_dir: Path, query: str, docs: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The model card's recipe, as its example code runs it: (p(yes) scores, yes - no logits)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    prefix = tokenizer.encode(QWEN3_RERANKER.prefix, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_RERANKER.suffix, add_special_tokens=False)
    texts = [f"<Instruct>: {QWEN3_RERANKER.instruction}\n<Query>: {query}\n<Document>: {doc}" for doc in docs]
    inputs = tokenizer(texts, padding=False, truncation="longest_first", return_attention_mask=False,
                       max_length=max_length - len(prefix) - len(suffix))
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    padded = tokenizer.pad(inputs, padding=True, return_tensors="pt")
    with torch.no_grad():
        last = model(**padded).logits[:, -1, :]
    pair = torch.nn.functional.log_softmax(torch.stack([last[:, no], last[:, yes]], dim=1), dim=1)
    return pair[:, 1].exp().numpy().astype(np.float64), (last[:, yes] - last[:, no]).numpy().astype(np.float64)


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_causal_lm_is_a_reranker_only_by_its_cards_text_ranking_tag() -> None:
    assert ranks_text(RANKING_CARD)
    assert not ranks_text("---\npipeline_tag: text-generation\n---\npipeline_tag: text-ranking\n")  # past the front
    assert infer_task(("config.json", "README.md"), CAUSAL, "x/y", RANKING_CARD) == "rerank"
    assert infer_task(("config.json",), CAUSAL, "x/y") == "text-generation"
    with pytest.raises(UnsupportedModel, match="prompt recipe of rerankers on qwen3"):
        infer_task(("config.json", "README.md"), {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
                   "x/llama-reranker", RANKING_CARD)


def test_the_reranker_is_built_with_its_recipe_and_gated_against_it(reranker: tuple[Path, Path]) -> None:
    config = load_engine_config(reranker[1] / "model")
    assert config.task == "rerank" and config.reranker.prompt == QWEN3_RERANKER
    assert config.reranker.activation == "sigmoid" and list(config.inputs) == ["input_ids", "attention_mask"]
    report = json.loads((reranker[1] / "report.json").read_text())
    assert report["passed"] and report["max_score_error"] <= 1e-3 and "recipe" in report["reference"]
    logits = [pair["reference"] for pair in report["pairs"]]
    assert max(logits) - min(logits) > 0.5  # the gate compared logits that differ, not one constant


def test_served_scores_are_the_cards(client: TestClient, reranker: tuple[Path, Path]) -> None:
    limit = load_engine_config(reranker[1] / "model").max_seq_length
    scores, logits = card_scores(reranker[0], QUERY, DOCS, limit)
    assert np.ptp(logits) > 0.1, logits  # the docs score apart, so the order below means something
    ranked = post(client, "/v1/ranking", {"query": {"text": QUERY}, "passages": [{"text": d} for d in DOCS]})
    got = {r["index"]: r["logit"] for r in ranked["rankings"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], logits, atol=1e-4)
    assert [r["index"] for r in ranked["rankings"]] == sorted(range(len(DOCS)), key=lambda i: -logits[i])
    cohere = post(client, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True})
    best = sorted(range(len(DOCS)), key=lambda i: -scores[i])[:2]
    assert [r["index"] for r in cohere["results"]] == best
    np.testing.assert_allclose([r["relevance_score"] for r in cohere["results"]], scores[best], atol=1e-4)
    assert [r["document"]["text"] for r in cohere["results"]] == [DOCS[i] for i in best]
    vllm = post(client, "/v1/score", {"text_1": QUERY, "text_2": DOCS})
    np.testing.assert_allclose([d["score"] for d in vllm["data"]], scores, atol=1e-4)


def test_a_long_document_is_refused_or_cut_as_the_card_cuts_it(client: TestClient,
                                                               reranker: tuple[Path, Path]) -> None:
    limit = load_engine_config(reranker[1] / "model").max_seq_length
    long = "the quick brown fox jumps over the lazy dog " * 200
    refused = post(client, "/v1/ranking", {"query": {"text": QUERY}, "passages": [{"text": long}]}, 400)
    assert f"at most {limit}" in refused["error"]["message"]
    cut = post(client, "/v1/score", {"text_1": QUERY, "text_2": [long, DOCS[0]], "truncate": "END"})
    scores, _ = card_scores(reranker[0], QUERY, [long, DOCS[0]], limit)
    np.testing.assert_allclose([d["score"] for d in cut["data"]], scores, atol=1e-4)
    assert cut["usage"]["prompt_tokens"] > limit  # the long pair was cut to the limit, not dropped


def test_the_deadline_covers_tokenizing(reranker: tuple[Path, Path]) -> None:
    """issue 57: a decoder reranker reads each pair as one text, so the largest legal rerank tokenizes its 8,192-
    character query with each of 2,048 passages: 15 s of tokenizing that MBUILD_REQUEST_TIMEOUT did not cover (a
    504 only after it, 670 MB later). The deadline covers it now, and stops it between two chunks."""
    with serving(reranker[1] / "model", request_timeout=1) as deadline_client:
        started = time.monotonic()
        stopped = deadline_client.post("/v1/rerank", json=MAXIMAL)
        took = time.monotonic() - started
        assert stopped.status_code == 504 and stopped.json()["error"]["code"] == "deadline_exceeded", stopped.text
        assert took < 4, f"the 504 came after {took:.1f} s"
        small = deadline_client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert small.status_code == 200, small.text  # nothing of the stopped request still holds the engine


def test_the_catalog_plans_qwen3_rerankers_as_rerankers_without_an_lm_head() -> None:
    for alias in ("qwen3-reranker-0.6b", "qwen3-reranker-4b", "qwen3-reranker-8b"):
        entry = lookup_alias(alias)
        assert entry is not None
        facts = entry.facts()
        assert (facts.task, facts.family, facts.tied) == ("rerank", "qwen3", True), alias
    small = lookup_alias("qwen3-reranker-0.6b")
    assert small is not None and 0.4 < small.facts().params < 0.7


def test_a_batch_split_by_the_attention_budget_scores_as_one_call(client: TestClient,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [d * k for d in DOCS for k in (1, 3)]
    whole = post(client, "/v1/score", {"text_1": QUERY, "text_2": docs})
    monkeypatch.setattr(encoder, "ATTENTION_BUDGET_BYTES", attention_bytes(4, 60))  # a call of a few short pairs
    calls: list[int] = []
    run_one = encoder.EncoderEngine._call

    def counted(self: encoder.EncoderEngine, batch: list[list[int]], types: list[list[int]] | None) -> np.ndarray:
        calls.append(len(batch))
        return run_one(self, batch, types)

    monkeypatch.setattr(encoder.EncoderEngine, "_call", counted)
    split = post(client, "/v1/score", {"text_1": QUERY, "text_2": docs})
    assert len(calls) > 2 and sum(calls) == len(docs), calls  # the batcher's calls were split
    np.testing.assert_allclose([d["score"] for d in split["data"]], [d["score"] for d in whole["data"]], atol=1e-6)


def test_a_hub_reranker_is_told_by_its_fetched_card(fake_hub: FakeHub, reranker: tuple[Path, Path],
                                                    tmp_path: Path) -> None:
    fake_hub.repos["org/qwen3-reranker"] = FakeRepo(reranker[0], sha="2" * 40)
    plan = plan_package(PackageOptions(model="org/qwen3-reranker", backend="none"), Reporter(quiet=True))
    assert plan.task == "rerank"
    assert any(r.endswith("/README.md") for r in fake_hub.requests)  # the card, fetched alone before planning
    cardless = shutil.copytree(reranker[0], tmp_path / "cardless")  # a causal LM without its card: a language model
    (cardless / "README.md").unlink()
    fake_hub.repos["org/qwen3-lm"] = FakeRepo(cardless, sha="3" * 40)
    plain = plan_package(PackageOptions(model="org/qwen3-lm", backend="none"), Reporter(quiet=True))
    assert plain.task == "text-generation"
