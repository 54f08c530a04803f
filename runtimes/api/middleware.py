"""One ASGI middleware for every request: request id, size limit, concurrency cap, metrics, access log,
drain hints."""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtimes.api.errors import ApiError, shape_of
from runtimes.health import State
from runtimes.ids import hex_id
from runtimes.state import ServiceState

log = logging.getLogger("mbuild.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_PROBES = ("/v1/health/", "/health", "/v2/health/")  # answered even at the concurrency cap


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContext:
    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app, self.state = app, state
        self.active = 0  # requests inside the app now
        state.metrics.describe("request_seconds", "Request latency by route")
        state.metrics.describe("requests_total", "Requests by route and status")

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, request_id: str, error: ApiError) -> None:
        response = error.response(shape_of(scope["path"]))  # no route yet: the path says which API asked
        response.headers["x-request-id"] = request_id
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        incoming = _header(scope, b"x-request-id")
        request_id = incoming if incoming and _REQUEST_ID.match(incoming) else hex_id()
        scope.setdefault("state", {})["request_id"] = request_id
        draining = self.state.health.state is State.DRAINING
        limit = self.state.settings.max_body_bytes
        length = _header(scope, b"content-length")
        refusal = None
        if length and length.isascii() and length.isdigit() and int(length) > limit:
            refusal = ApiError(413, f"the request body is larger than {limit} bytes (MBUILD_MAX_BODY_BYTES)",
                               "body_too_large")
        elif self.active >= self.state.settings.max_concurrent and not scope["path"].startswith(_PROBES):
            refusal = ApiError(503, f"the server holds {self.active} requests, its limit (MBUILD_MAX_CONCURRENT); "
                                    "retry shortly", "too_many_requests", headers={"Retry-After": "1"})
        if refusal is not None:
            await self._refuse(scope, receive, send, request_id, refusal)
            self._record(scope, refusal.status, start, request_id)
            return

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if draining:  # no keep-alive while draining: clients reconnect, and find the next replica
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        self.active += 1
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.active -= 1
            self._record(scope, status, start, request_id)

    def _record(self, scope: Scope, status: int, start: float, request_id: str) -> None:
        elapsed = time.perf_counter() - start
        route = getattr(scope.get("route"), "path", "unmatched")
        self.state.metrics.inc("requests_total", route=route, code=str(status))
        self.state.metrics.observe("request_seconds", elapsed, route=route)
        if self.state.settings.access_log:
            # Method, path, status and time only: bodies (prompts, texts) are never logged.
            log.info("%s %s %d %.1fms request_id=%s", scope.get("method"), scope.get("path"), status,
                     elapsed * 1000, request_id)
