"""The rerank task end to end in-process: a cross-encoder trained on a rule the test knows (tests/support/
tiny_models.py's TOPICS: a passage is relevant to a query of its own topic) packaged through the real pipeline,
gated against sentence-transformers' CrossEncoder, and served on NIM's /v1/ranking, the Cohere/Jina /v1/rerank and
/rerank, vLLM's /v1/score and KServe V2, each answering as its clients expect."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sentence_transformers import CrossEncoder
from transformers import AutoTokenizer

from builder.engine.validate_reranker import rank_correlation
from builder.model.facts import infer_task
from runtimes.bundle import load_engine_config, load_report
from runtimes.bundle.report import RerankReport
from runtimes.tokenize import InputTooLong, PairTokenizer
from tests.support.hostile_rerank_cases import MAXIMAL
from tests.support.tiny_models import TOPICS
from tests.unit.runtimes.api.test_generation_service import serving

QUERY = "fox"  # topic 0
RELEVANT = ["the quick brown dog jumps over", "lazy world model image hello container"]
OTHER = ["vector python docker cosine engine serve", "token batch health ready build profile"]
DOCS = [OTHER[0], RELEVANT[0], OTHER[1], RELEVANT[1]]
LONG = " ".join(TOPICS[1] * 8)  # past the tiny model's 64 tokens a pair


@pytest.fixture(scope="module")
def client(tiny_rerank_build: Path) -> Iterator[TestClient]:
    with serving(tiny_rerank_build / "model") as test_client:
        yield test_client


@pytest.fixture(scope="module")
def reference(tiny_cross_encoder: Path) -> CrossEncoder:
    return CrossEncoder(str(tiny_cross_encoder), device="cpu", max_length=64)


def logits_of(reference: CrossEncoder, pairs: list[tuple[str, str]]) -> np.ndarray:
    return np.asarray(reference.predict(pairs, activation_fn=torch.nn.Identity(), show_progress_bar=False))


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    data: dict[str, Any] = response.json()
    return data


def test_a_one_label_encoder_head_is_a_reranker_built_and_gated(tiny_rerank_build: Path) -> None:
    model = tiny_rerank_build / "model"
    config, report = load_engine_config(model), load_report(model)
    assert config.task == "rerank" and config.reranker.activation == "sigmoid"
    assert "token_type_ids" in config.inputs  # BERT's pair template gives the passage type 1
    assert isinstance(report, RerankReport) and report.passed
    assert report.max_score_error < 1e-3 and report.min_rank_correlation > 0.9999
    assert len(report.pairs) == 30  # three queries against each gate text


def test_the_order_check_counts_swaps_beyond_the_measured_error_only() -> None:
    want = np.array([3.0, 1.0, 2.0, 2.0000004, 0.5])
    near = want + np.array([0, 0, 3e-7, -3e-7, 0])  # the two near-tied passages swapped, within 3e-7 each
    assert rank_correlation(near, want, tie=6e-7) == 1.0
    assert rank_correlation(near, want, tie=0.0) < 1.0  # counted as a swap where nothing may tie
    far = want.copy()
    far[[0, 1]] = far[[1, 0]]  # the best and a poor passage swapped: a real disagreement
    assert rank_correlation(far, want, tie=6e-7) < 0.5
    assert rank_correlation(want + 1.0, np.full(5, 2.0), tie=1e-6) == 1.0  # the reference orders nothing


def test_the_task_is_read_from_the_head_even_beside_sentence_transformers_files(tiny_cross_encoder: Path) -> None:
    config = json.loads((tiny_cross_encoder / "config.json").read_text())
    assert infer_task(("config.json", "modules.json"), config, "x/y") == "rerank"


def test_ranking_returns_the_reference_logits_best_first(client: TestClient, reference: CrossEncoder) -> None:
    body = post(client, "/v1/ranking", {"query": {"text": QUERY}, "passages": [{"text": d} for d in DOCS]})
    want = logits_of(reference, [(QUERY, d) for d in DOCS])
    rankings = body["rankings"]
    assert [r["index"] for r in rankings] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert {r["index"] for r in rankings[:2]} == {1, 3}  # the rule the model learned: its topic first
    for r in rankings:
        assert abs(r["logit"] - want[r["index"]]) < 1e-4


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_in_the_cohere_shape(client: TestClient, reference: CrossEncoder, path: str) -> None:
    body = post(client, path, {"query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]], "top_n": 2,
                               "return_documents": True, "model": client.get("/v1/models").json()["data"][0]["id"]})
    want = logits_of(reference, [(QUERY, d) for d in DOCS])
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -want[i])[:2]
    for result in body["results"]:
        assert result["document"] == {"text": DOCS[result["index"]]}
        assert abs(result["relevance_score"] - 1 / (1 + math.exp(-want[result["index"]]))) < 1e-5
    assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
    plain = post(client, path, {"query": QUERY, "documents": DOCS})
    assert len(plain["results"]) == 4 and all("document" not in r for r in plain["results"])


def test_score_pairs_one_query_or_one_per_passage(client: TestClient, reference: CrossEncoder) -> None:
    one = post(client, "/v1/score", {"text_1": QUERY, "text_2": DOCS})
    want = 1 / (1 + np.exp(-logits_of(reference, [(QUERY, d) for d in DOCS])))
    assert [d["index"] for d in one["data"]] == [0, 1, 2, 3]
    assert np.allclose([d["score"] for d in one["data"]], want, atol=1e-5)
    queries = ["docker", "fox"]
    zipped = post(client, "/v1/score", {"text_1": queries, "text_2": OTHER})
    assert np.allclose([d["score"] for d in zipped["data"]],
                       1 / (1 + np.exp(-logits_of(reference, list(zip(queries, OTHER, strict=True))))), atol=1e-5)
    assert zipped["data"][0]["score"] > 0.5 > zipped["data"][1]["score"]
    refused = post(client, "/v1/score", {"text_1": ["a", "b"], "text_2": DOCS}, 400)
    assert "send one text_1, or as many as text_2" in refused["error"]["message"]


def test_long_pairs_are_cut_longest_first_as_the_reference_cuts_them(client: TestClient,
                                                                     reference: CrossEncoder) -> None:
    refused = post(client, "/v1/ranking", {"query": {"text": QUERY}, "passages": [{"text": LONG}]}, 400)
    assert refused["error"]["code"] == "input_too_long" and '"truncate": "END"' in refused["error"]["message"]
    cut = post(client, "/v1/ranking", {"query": {"text": QUERY}, "passages": [{"text": LONG}], "truncate": "END"})
    assert abs(cut["rankings"][0]["logit"] - logits_of(reference, [(QUERY, LONG)])[0]) < 1e-4
    assert len(post(client, "/v1/rerank", {"query": QUERY, "documents": [LONG]})["results"]) == 1  # END by default
    assert post(client, "/v1/rerank", {"query": QUERY, "documents": [LONG], "truncate": "NONE"}, 400)


def test_the_pair_tokenizer_is_transformers_pair_encoding(tiny_rerank_build: Path, tiny_cross_encoder: Path) -> None:
    hf = AutoTokenizer.from_pretrained(tiny_cross_encoder)
    ours = PairTokenizer(tiny_rerank_build / "model" / "tokenizer.json", 64)
    pairs = [(QUERY, DOCS[1]), (QUERY * 40, "dog"), (QUERY, LONG)]
    for (query, passage), got in zip(pairs, ours.encode(pairs, truncate="END"), strict=True):
        want = hf(query, passage, truncation=True, max_length=64)
        assert got.ids == want["input_ids"] and got.types == want["token_type_ids"]


@pytest.mark.parametrize("limit", [63, 64])  # an odd budget gives its spare token to the longer side
def test_each_length_is_cut_as_transformers_cuts_it(tiny_rerank_build: Path, tiny_cross_encoder: Path,
                                                    limit: int) -> None:
    """The query is tokenized once a request, apart from its passages (issue 57): every pair of lengths around the
    limit, either side longer, still cuts as transformers cuts the pair, and an uncut pair's count is its tokens."""
    hf = AutoTokenizer.from_pretrained(tiny_cross_encoder)
    ours = PairTokenizer(tiny_rerank_build / "model" / "tokenizer.json", limit)
    lengths = [1, 2, 30, 31, limit - 4, limit - 3, limit - 2, limit - 1, limit, limit + 1, limit + 2, 200]
    pairs = [("a " * q, "b " * p) for q in lengths for p in lengths]  # one token a letter
    for (query, passage), got in zip(pairs, ours.encode(pairs, truncate="END"), strict=True):
        want = hf(query, passage, truncation=True, max_length=limit)
        assert (got.ids, got.types) == (want["input_ids"], want["token_type_ids"]), (len(query), len(passage))
    for index, pair in enumerate(pairs):
        whole = len(hf(*pair)["input_ids"])
        if whole > limit:
            with pytest.raises(InputTooLong) as refused:
                ours.encode([pairs[0], pair])
            assert (refused.value.index, refused.value.tokens) == (1, whole)
        else:
            assert len(ours.encode([pair])[0]) == whole, index


def _status(field: str) -> float:
    """This process's resident memory (VmRSS) or its peak (VmHWM), in MB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(status[field].split()[0]) / 1024


def test_a_maximal_rerank_is_quick_and_small(client: TestClient) -> None:
    """issue 57: the largest legal rerank (an 8,192-character query, 2,048 documents, truncate END) tokenized its
    query twice a pair and kept every cut pair's whole query as overflow: 22 s and +160 MB of resident memory on the
    tiny model (+860 MB on a 512-token one), kept after. The query is tokenized once now."""
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    before, started = _status("VmRSS"), time.monotonic()
    ranked = post(client, "/v1/rerank", MAXIMAL)
    took, grew = time.monotonic() - started, _status("VmHWM") - before
    assert len(ranked["results"]) == 2048
    assert grew < 48, f"one maximal rerank raised the peak by {grew:.0f} MB"
    assert took < 10, f"one maximal rerank took {took:.1f} s"


def test_batched_pairs_score_as_they_do_alone(client: TestClient) -> None:
    def one(passage: str) -> float:
        body = post(client, "/v1/score", {"text_1": QUERY, "text_2": passage, "truncate": "END"})
        return float(body["data"][0]["score"])

    alone = [one(d) for d in [*DOCS, LONG]]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, [*DOCS, LONG] * 4))
    assert np.allclose(together, alone * 4, atol=1e-6)


def test_kserve_v2_scores_and_logits(client: TestClient, reference: CrossEncoder) -> None:
    name = client.get("/v1/models").json()["data"][0]["id"]
    meta = client.get(f"/v2/models/{name}").json()
    assert [i["name"] for i in meta["inputs"]] == ["query", "passages"]
    assert [o["name"] for o in meta["outputs"]] == ["score", "logit"]
    body = {"inputs": [{"name": "query", "datatype": "BYTES", "shape": [1], "data": [QUERY]},
                       {"name": "passages", "datatype": "BYTES", "shape": [len(DOCS)], "data": DOCS}]}
    outputs = {o["name"]: o["data"] for o in post(client, f"/v2/models/{name}/infer", body)["outputs"]}
    want = logits_of(reference, [(QUERY, d) for d in DOCS])
    assert np.allclose(outputs["logit"], want, atol=1e-4)
    assert np.allclose(outputs["score"], 1 / (1 + np.exp(-want)), atol=1e-5)
    two = {**body, "inputs": [{**body["inputs"][0], "shape": [2], "data": [QUERY, QUERY]}, body["inputs"][1]]}
    assert "send one" in post(client, f"/v2/models/{name}/infer", two, 400)["error"]


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/v1/rerank", {"query": "", "documents": ["a"]}, "empty_input"),
    ("/v1/rerank", {"query": "q" * 8193, "documents": ["a"]}, "query_too_long"),
    ("/v1/rerank", {"query": "q", "documents": []}, "invalid_request"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 2049}, "invalid_request"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "invalid_request"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 2}, "invalid_request"),
    ("/v1/ranking", {"query": "q", "passages": [{"text": "a"}]}, "invalid_request"),
    ("/v1/ranking", {"query": {"text": "q"}, "passages": [{"text": "a"}], "truncate": "START"}, "invalid_request"),
    ("/v1/score", {"text_1": [], "text_2": ["a"]}, "invalid_request"),
    ("/v1/embeddings", {"input": "a"}, "wrong_task"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "wrong_task"),
])
def test_bad_requests_get_a_4xx_that_says_why(client: TestClient, path: str, body: dict[str, Any], code: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["code"] == code
    assert client.get("/v1/health/ready").status_code == 200


def test_an_embedding_model_says_which_routes_it_serves(tiny_build: Path) -> None:
    with serving(tiny_build / "model") as embedder:
        refused = post(embedder, "/v1/rerank", {"query": "q", "documents": ["a"]}, 404)
    assert refused["error"]["message"] == "this model serves /v1/embeddings (embedding), not reranking"
