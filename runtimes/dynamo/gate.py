"""The API key in front of Dynamo's frontend: Dynamo's HTTP service (Rust, in the ai-dynamo-runtime wheel) has no
bearer-key check and no middleware hook (its Python side can add routes, not guard them), and it serves admin routes
(`POST /busy_threshold`) beside the OpenAI ones. So where MBUILD_API_KEY is set the frontend listens on a loopback
port of its own and this gate takes the operator's address: every request but the health probes (and /metrics,
under the image's own rule, MBUILD_PROTECT_METRICS) must carry the key, checked by runtimes/api/auth.py exactly as
the single-container server checks it; what passes is relayed as it comes, streams included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runtimes.api.auth import check_bearer
from runtimes.api.errors import ApiError

OPEN_PATHS = frozenset({"/health", "/live"})  # Dynamo's frontend probes, as the orchestrator asks them
METRICS_PATHS = frozenset({"/metrics"})
# Hop-by-hop headers (RFC 9110 7.6.1) and those the relay sets itself.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                      "upgrade", "host", "content-length"})


def streamed_back(upstream: httpx.Response, headers: dict[str, str]) -> StreamingResponse:
    """An upstream response opened with stream=True, relayed as its bytes come, closed when they end or the client
    leaves."""
    async def body() -> AsyncIterator[bytes]:
        try:
            async for piece in upstream.aiter_raw():
                yield piece
        finally:
            await upstream.aclose()
    return StreamingResponse(body(), status_code=upstream.status_code, headers=headers)


def needs_key(path: str, protect_metrics: bool) -> bool:
    return path not in OPEN_PATHS and (protect_metrics or path not in METRICS_PATHS)


class Gate:
    """An ASGI app: check the key, then relay the request to `upstream` (http://127.0.0.1:PORT)."""

    def __init__(self, upstream: str, api_key: str, protect_metrics: bool) -> None:
        self.api_key, self.protect_metrics = api_key, protect_metrics
        # No timeout on reads: a long generation streams for minutes; the frontend bounds its own requests.
        self.client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(None, connect=10.0))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets: Dynamo's frontend serves none
            return
        request = Request(scope, receive)
        try:
            if needs_key(request.url.path, self.protect_metrics):
                check_bearer(request, self.api_key)
            response = await self._relay(request)
        except ApiError as refused:
            response = refused.response()
        await response(scope, receive, send)

    async def _relay(self, request: Request) -> Response:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROPPED]
        outgoing = self.client.build_request(request.method, request.url.path, params=request.url.query,
                                             headers=headers, content=request.stream())
        try:
            upstream = await self.client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            raise ApiError(503, f"the model's frontend is not reachable: {type(exc).__name__}", "unavailable",
                           headers={"Retry-After": "1"}) from exc

        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED}
        return streamed_back(upstream, kept)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return
