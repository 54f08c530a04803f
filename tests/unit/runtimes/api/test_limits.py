"""Limits, request ids, logs, protected metrics, the bounded queue and the batching delay."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtimes.api.app import create_app
from runtimes.encoder_batcher import Batcher, QueueFull
from runtimes.logs import JsonFormatter
from runtimes.metrics import Metrics
from runtimes.settings import Settings


def settings(model_dir: Path, **overrides: object) -> Settings:
    base = {"model_dir": model_dir, "host": "127.0.0.1", "port": 8000, "api_key": None, "log_level": "info",
            "log_format": "text", "threads": 1, "max_queue": 64, "served_name": None, "max_body_bytes": 2048}
    return Settings(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def client(tiny_build: Path, request: pytest.FixtureRequest) -> Iterator[TestClient]:
    overrides = getattr(request, "param", {})
    with TestClient(create_app(settings(tiny_build / "model", **overrides))) as test_client:
        deadline = time.monotonic() + 30
        while test_client.get("/v1/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield test_client


def test_a_body_over_the_limit_is_413_both_ways(client: TestClient) -> None:
    big = json.dumps({"input": "x" * 4000}).encode()
    declared = client.post("/v1/embeddings", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for start in range(0, len(big), 500):
            yield big[start:start + 500]

    streamed = client.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert client.get("/v1/health/ready").status_code == 200


def test_v2_answers_in_its_own_shape_before_routing_too(client: TestClient) -> None:
    """KServe V2 errors are {"error": "..."}: a body refused by its declared size (before any route) reads as one
    refused as it arrives (inside the route), and an unknown /v2 path as a V2 route's error does."""
    big = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x" * 4000]}]})
    declared = client.post("/v2/models/m/infer", content=big, headers={"content-type": "application/json"})
    streamed = client.post("/v2/models/m/infer", content=iter([big.encode()]),
                           headers={"content-type": "application/json"})
    assert declared.status_code == streamed.status_code == 413
    assert declared.json() == streamed.json() == {
        "error": "the request body is larger than 2048 bytes (MBUILD_MAX_BODY_BYTES)"}
    unknown = client.get("/v2/nowhere")
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str), unknown.text
    assert client.get("/v1/nowhere").json()["error"]["code"] == "not_found"  # OpenAI's shape stays on /v1


def test_request_ids_are_echoed_or_made(client: TestClient) -> None:
    assert client.get("/v1/health/live", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = client.get("/v1/health/live", headers={"X-Request-ID": "bad id\nwith newline"}).headers["x-request-id"]
    assert len(made) == 32 and "\n" not in made


def test_access_log_is_json_and_has_no_body(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mbuild.access"):
        client.post("/v1/embeddings", json={"input": "secret customer text"}, headers={"X-Request-ID": "r-1"})
    record = next(r for r in caplog.records if r.name == "mbuild.access")
    line = json.loads(JsonFormatter().format(record))
    assert (line["method"], line["path"], line["status"], line["request_id"]) == ("POST", "/v1/embeddings", 200, "r-1")
    assert "secret customer text" not in caplog.text


@pytest.mark.parametrize("client", [{"api_key": "k", "protect_metrics": True}], indirect=True)
def test_protected_metrics_and_v2_auth(client: TestClient) -> None:
    assert client.get("/v1/metrics").status_code == 401
    assert client.get("/v1/metrics", headers={"Authorization": "Bearer k"}).status_code == 200
    assert client.get("/v1/health/ready").status_code == 200  # health stays open
    for path in ("/v1/models", "/v1/metadata", "/docs", "/openapi.json", "/v2"):
        assert client.get(path).status_code == 401, path
    name = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"]
    assert client.get(f"/v2/models/{name}").status_code == 401
    assert client.get(f"/v2/models/{name}/ready").status_code == 200  # a readiness probe, like health
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    denied = client.post(f"/v2/models/{name}/infer", json=body)
    assert denied.status_code == 401 and "API key" in denied.json()["error"]


@pytest.mark.parametrize("client", [{"request_timeout": 1}], indirect=True)
def test_a_request_that_runs_too_long_is_504_and_one_that_waited_is_503(client: TestClient) -> None:
    batcher = client.app.state.service.embedding.batcher  # type: ignore[attr-defined]
    real = batcher._run

    def slow(seqs: list[list[int]]) -> np.ndarray:
        time.sleep(1.5)
        return np.asarray(real(seqs))

    batcher._run = slow
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, "/v1/embeddings", json={"input": "runs"})
            time.sleep(0.3)  # the first is in the engine; the second waits behind it
            second = pool.submit(client.post, "/v1/embeddings", json={"input": "waits"})
            ran, waited = first.result(), second.result()
    finally:
        batcher._run = real
    # It was running: a retry would repeat the work, so no Retry-After.
    assert ran.status_code == 504 and "retry-after" not in ran.headers
    assert ran.json()["error"]["code"] == "deadline_exceeded"
    assert waited.status_code == 503 and waited.headers["retry-after"] == "1"
    assert waited.json()["error"]["code"] == "timeout"


def test_the_queue_is_bounded() -> None:
    async def scenario() -> list[str]:
        def slow(seqs: list[list[int]]) -> np.ndarray:
            time.sleep(0.2)
            return np.zeros((len(seqs), 2), np.float32)

        batcher = Batcher(slow, max_batch=1, max_queue=2, metrics=Metrics())
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([[1]]) for _ in range(6)), return_exceptions=True)
        await batcher.stop()
        return ["full" if isinstance(r, QueueFull) else "ok" for r in results]

    outcome = asyncio.run(scenario())
    assert "full" in outcome and outcome.count("ok") >= 2


def test_the_batch_delay_only_applies_under_load() -> None:
    async def scenario() -> tuple[float, list[int]]:
        sizes: list[int] = []

        def run(seqs: list[list[int]]) -> np.ndarray:
            sizes.append(len(seqs))
            time.sleep(0.01)
            return np.zeros((len(seqs), 2), np.float32)

        batcher = Batcher(run, max_batch=16, max_queue=64, metrics=Metrics(), max_delay=0.05)
        batcher.start()
        started = time.perf_counter()
        await batcher.submit([[1]])  # alone: no waiting for company
        alone = time.perf_counter() - started
        await asyncio.gather(*(batcher.submit([[i]]) for i in range(12)))
        await batcher.stop()
        return alone, sizes

    alone, sizes = asyncio.run(scenario())
    assert alone < 0.05
    assert max(sizes) > 1


def test_an_abandoned_job_stops_computing_and_the_next_one_runs() -> None:
    async def scenario() -> tuple[list[list[int]], np.ndarray]:
        calls: list[list[int]] = []

        def run(seqs: list[list[int]]) -> np.ndarray:
            calls.append([s[0] for s in seqs])
            time.sleep(0.02)
            return np.asarray([[float(s[0])] for s in seqs], np.float32)

        batcher = Batcher(run, max_batch=4, max_queue=8, metrics=Metrics(), max_delay=0.0)
        big = batcher.enqueue([[1000 + i] for i in range(400)])  # 100 engine calls if nobody stopped it
        small = batcher.enqueue([[7]])
        batcher.start()
        await asyncio.sleep(0.1)
        big.future.cancel()  # its client left
        rows = await asyncio.wait_for(small.future, 5)
        await batcher.stop()
        return calls, rows

    calls, rows = asyncio.run(scenario())
    assert rows.tolist() == [[7.0]]
    assert len(calls) < 20  # stopped a few calls after the cancel, not 100
    assert any(7 in call for call in calls)
