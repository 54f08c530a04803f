"""runtimes/dynamo/gate.py, the key check in front of Dynamo's frontend, over real sockets: a stand-in upstream (the
real frontend needs workers; tests/integration/test_dynamo_replicas.py runs that one) served by uvicorn, the gate
served by uvicorn in front of it, a real HTTP client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtimes.dynamo.gate import Gate
from tests.support.net import free_port

KEY = "gate-test-key"


async def _stream(request: Request) -> Response:
    body = await request.json()

    async def events() -> AsyncIterator[bytes]:
        for n in range(body["n"]):
            yield f"data: {n}\n\n".encode()
            await asyncio.sleep(0.01)
    return StreamingResponse(events(), media_type="text/event-stream", headers={"x-upstream": "yes"})


async def _echo(request: Request) -> Response:
    return JSONResponse({"path": request.url.path, "query": request.url.query,
                         "saw_key": request.headers.get("authorization") == f"Bearer {KEY}"})

UPSTREAM = Starlette(routes=[Route("/v1/chat/completions", _stream, methods=["POST"]),
                             Route("/{path:path}", _echo, methods=["GET", "POST"])])


def _serve(app: object, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))  # type: ignore[arg-type]
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "a test server did not start"
        time.sleep(0.02)
    return server


@pytest.fixture()
def gate() -> Iterator[tuple[str, uvicorn.Server]]:
    upstream_port, gate_port = free_port(), free_port()
    upstream = _serve(UPSTREAM, upstream_port)
    front = _serve(Gate(f"http://127.0.0.1:{upstream_port}", KEY, protect_metrics=False), gate_port)
    yield f"http://127.0.0.1:{gate_port}", upstream
    for server in (front, upstream):
        server.should_exit = True


def test_every_route_but_the_probes_needs_the_key(gate: tuple[str, uvicorn.Server]) -> None:
    url, _ = gate
    for path in ("/v1/models", "/busy_threshold", "/openapi.json", "/anything/else"):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}):
            got = httpx.post(f"{url}{path}", headers=headers)
            assert got.status_code == 401, (path, headers, got.text)
            assert got.json()["error"]["code"] == "invalid_api_key"
    for path in ("/health", "/live", "/metrics"):  # metrics: open unless MBUILD_PROTECT_METRICS, as in the image
        assert httpx.get(f"{url}{path}").json()["path"] == path
    passed = httpx.get(f"{url}/v1/models?limit=3", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert passed == {"path": "/v1/models", "query": "limit=3", "saw_key": True}


def test_metrics_take_the_key_when_protected() -> None:
    upstream_port, gate_port = free_port(), free_port()
    servers = [_serve(UPSTREAM, upstream_port),
               _serve(Gate(f"http://127.0.0.1:{upstream_port}", KEY, protect_metrics=True), gate_port)]
    try:
        assert httpx.get(f"http://127.0.0.1:{gate_port}/metrics").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{gate_port}/health").status_code == 200
    finally:
        for server in servers:
            server.should_exit = True


def test_a_stream_is_relayed_as_it_comes(gate: tuple[str, uvicorn.Server]) -> None:
    url, _ = gate
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={"n": 5},
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200 and response.headers["x-upstream"] == "yes"
        assert response.headers["content-type"].startswith("text/event-stream")
        assert [line for line in response.iter_lines() if line] == [f"data: {n}" for n in range(5)]


def test_a_frontend_that_is_gone_is_a_503_not_a_crash(gate: tuple[str, uvicorn.Server]) -> None:
    url, upstream = gate
    upstream.should_exit = True
    deadline = time.monotonic() + 10
    while True:
        got = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        if got.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert got.status_code == 503 and got.json()["error"]["code"] == "unavailable"
