"""The runtime's HTTP contract, served in-process with a real ONNX Runtime engine (tiny model)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtimes.api.admission import off_loop
from runtimes.api.app import create_app
from runtimes.bundle import load_engine_config
from runtimes.engines import encoder_for
from runtimes.settings import Settings
from runtimes.tokenize import INLINE_CHARS, InputTooLong, TextTokenizer


def settings(model_dir: Path, **overrides: object) -> Settings:
    base = {"model_dir": model_dir, "host": "127.0.0.1", "port": 8000, "api_key": None, "log_level": "info",
            "log_format": "text", "threads": 1, "max_queue": 64, "served_name": None}
    return Settings(**{**base, **overrides})  # type: ignore[arg-type]


def wait_ready(client: TestClient, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/v1/health/ready").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError(client.get("/v1/health/ready").json())


@pytest.fixture
def client(tiny_build: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tiny_build / "model"))) as test_client:
        wait_ready(test_client)
        yield test_client


def direct_embeddings(model_dir: Path, texts: list[str]) -> np.ndarray:
    config = load_engine_config(model_dir)
    engine = encoder_for(model_dir, config, 1)
    return engine.run(TextTokenizer(model_dir / "tokenizer.json", config.max_seq_length).encode(texts))


def test_live_and_ready(client: TestClient) -> None:
    assert client.get("/v1/health/live").json() == {"status": "live"}
    assert client.get("/v1/health/ready").json() == {"status": "ready"}
    assert client.get("/health").json() == {"status": "ready"}  # vLLM's and TGI's name for it


def test_embeddings_match_the_engine(client: TestClient, tiny_build: Path) -> None:
    texts = ["hello world", "the quick brown fox jumps over the lazy dog"]
    body = client.post("/v1/embeddings", json={"input": texts}).json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.allclose(got, direct_embeddings(tiny_build / "model", texts), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4
    assert body["model"] == client.get("/v1/models").json()["data"][0]["id"]


def test_base64_encoding_decodes_to_the_floats(client: TestClient) -> None:
    floats = client.post("/v1/embeddings", json={"input": "hello"}).json()["data"][0]["embedding"]
    encoded = client.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats)


@pytest.mark.parametrize(("payload", "status", "code"), [
    ({"input": ""}, 400, "empty_input"),
    ({"input": []}, 400, "empty_input"),
    ({"input": 3}, 400, "invalid_request"),
    ({"input": "x", "model": "someone/else"}, 404, "model_not_found"),
    ({"input": "x", "dimensions": 7}, 400, "unsupported_dimensions"),
    ({"input": "x", "encoding_format": "int8"}, 400, "invalid_request"),
    ({"input": "hello " * 100}, 400, "input_too_long"),
    ({"input": ["x"] * 2049}, 400, "too_many_inputs"),
])
def test_bad_requests_get_4xx_json(client: TestClient, payload: dict[str, object], status: int, code: str) -> None:
    response = client.post("/v1/embeddings", json=payload)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert client.get("/v1/health/ready").status_code == 200


@pytest.mark.parametrize(("raw", "code"), [
    (b"", "empty_body"), (b"{bad", "invalid_json"), (b"\xff\xfe\x00", "invalid_encoding"), (b"[1, 2]", "invalid_json"),
])
def test_malformed_bodies(client: TestClient, raw: bytes, code: str) -> None:
    response = client.post("/v1/embeddings", content=raw, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()["error"]["code"]) == (400, code)


def test_form_encoded_json_is_accepted(client: TestClient) -> None:
    # `curl -d '{...}'` without a content type sends form encoding; the body is still JSON.
    response = client.post("/v1/embeddings", content=b'{"input": "hello"}',
                           headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200


def test_truncation_on_request(client: TestClient) -> None:
    long_text = "hello " * 100
    end = client.post("/v1/embeddings", json={"input": long_text, "truncate": "END"}).json()
    assert end["usage"]["prompt_tokens"] == 48  # the model's max_seq_length, special tokens included


def test_unknown_route_and_method(client: TestClient) -> None:
    missing = client.post("/v1/nothing", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = client.delete("/v1/embeddings")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST"


def test_every_schema_reference_resolves(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(document)))
    assert refs and refs <= set(document["components"]["schemas"]), refs - set(document["components"]["schemas"])


def test_metadata_reports_model_profile_and_validation(client: TestClient) -> None:
    meta = client.get("/v1/metadata").json()
    assert meta["profile"]["name"] == "onnxruntime-cpu-fp32-tp1-latency"
    assert len(meta["model"]["sha"]) == 40
    assert meta["validation"]["passed"] is True and meta["validation"]["min_cosine"] >= 0.9999
    assert meta["engine"]["options"]["embedding_dim"] == 32


def test_metrics_count_requests_and_batches(client: TestClient) -> None:
    client.post("/v1/embeddings", json={"input": ["a", "b", "c"]})
    text = client.get("/v1/metrics").text
    assert 'mbuild_requests_total{code="200",route="/v1/embeddings"} 1' in text
    assert "mbuild_batch_size_sum 3" in text
    assert "mbuild_ready 1" in text
    assert "mbuild_batch_size_sum 3" in client.get("/metrics").text  # Prometheus' default path, same series


def test_model_retrieve_version_and_manifest(client: TestClient) -> None:
    """OpenAI's GET /v1/models/{id} by any served name (org/name keeps its slash); NIM's version and manifest."""
    listed = client.get("/v1/models").json()["data"][0]
    meta = client.get("/v1/metadata").json()
    assert client.get(f"/v1/models/{listed['id']}").json() == listed
    by_repo = client.get(f"/v1/models/{meta['model']['repo']}")
    assert by_repo.status_code == 200 and by_repo.json()["id"] == meta["model"]["repo"]
    missing = client.get("/v1/models/no-such/model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert client.get("/v1/version").json()["release"]
    manifest = client.get("/v1/manifest").json()
    assert manifest["profiles"][0]["name"] == meta["profile"]["name"] and manifest["model"] == meta["model"]


def test_concurrent_requests_batch_and_stay_exact(client: TestClient, tiny_build: Path) -> None:
    texts = [f"hello world {'fox ' * i}" for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda t: client.post("/v1/embeddings", json={"input": t}).json(), texts))
    got = np.array([r["data"][0]["embedding"] for r in results], dtype=np.float32)
    assert np.allclose(got, direct_embeddings(tiny_build / "model", texts), atol=1e-5)


def test_api_key_guards_inference_not_health(tiny_build: Path) -> None:
    with TestClient(create_app(settings(tiny_build / "model", api_key="s3cret"))) as c:
        wait_ready(c)
        denied = c.post("/v1/embeddings", json={"input": "x"})
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
        wrong = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/v1/health/ready").status_code == 200


def test_broken_bundle_never_becomes_ready(tiny_build: Path, tmp_path: Path) -> None:
    broken = tmp_path / "model"
    shutil.copytree(tiny_build / "model", broken)
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    with TestClient(create_app(settings(broken))) as c:
        deadline = time.monotonic() + 10
        while c.get("/v1/health/ready").json()["status"] not in {"failed"} and time.monotonic() < deadline:
            time.sleep(0.02)
        ready = c.get("/v1/health/ready")
        assert ready.status_code == 503
        assert ready.json()["status"] == "failed" and "cannot load" in ready.json()["reason"]
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 503
        assert c.get("/health").status_code == 503


def test_engine_json_round_trip(tiny_build: Path) -> None:
    raw = json.loads((tiny_build / "model" / "engine.json").read_text())
    assert load_engine_config(tiny_build / "model").to_dict() == raw


def test_tokenizing_inline_and_on_a_thread_agree(tiny_build: Path) -> None:
    model_dir = tiny_build / "model"
    tokenizer = TextTokenizer(model_dir / "tokenizer.json", load_engine_config(model_dir).max_seq_length)
    short, long = ["hello world"], ["the quick brown fox " * (INLINE_CHARS // 10)]
    assert asyncio.run(off_loop(tokenizer.encode, short, size=len(short[0]))) == tokenizer.encode(short)
    assert asyncio.run(off_loop(tokenizer.encode, long, "END", size=len(long[0]))) == tokenizer.encode(long, "END")
    with pytest.raises(InputTooLong):
        asyncio.run(off_loop(tokenizer.encode, long, size=len(long[0])))


def test_token_id_inputs_embed_as_their_text_does(client: TestClient, tiny_build: Path) -> None:
    """What LangChain's OpenAIEmbeddings sends: the model's token ids, one list or a list of lists."""
    config = load_engine_config(tiny_build / "model")
    tokenizer = TextTokenizer(tiny_build / "model" / "tokenizer.json", config.max_seq_length)
    texts = ["hello world", "the quick brown fox"]
    ids = tokenizer.encode(texts)
    by_text = client.post("/v1/embeddings", json={"input": texts}).json()
    by_ids = client.post("/v1/embeddings", json={"input": ids}).json()
    one = client.post("/v1/embeddings", json={"input": ids[0]}).json()
    assert by_ids["usage"] == by_text["usage"]
    for mine, theirs in zip(by_ids["data"], by_text["data"], strict=True):
        np.testing.assert_allclose(mine["embedding"], theirs["embedding"], atol=1e-6)
    np.testing.assert_allclose(one["data"][0]["embedding"], by_text["data"][0]["embedding"], atol=1e-6)
    for bad, code in (([ids[0], "text"], "invalid_request"), ([[1, 10**9]], "invalid_token_id"), ([[]], "empty_input"),
                      ([ids[0] * 200], "input_too_long")):
        response = client.post("/v1/embeddings", json={"input": bad})
        assert response.status_code == 400 and response.json()["error"]["code"] == code, (bad, response.text)
    cut = client.post("/v1/embeddings", json={"input": [ids[0] * 200], "truncate": "END"})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == config.max_seq_length
