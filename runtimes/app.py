"""The ASGI application: routes, error mapping, request metrics, and the load/drain lifecycle."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtimes import __version__
from runtimes.api_errors import ApiError, error_response
from runtimes.bodies import describe_errors
from runtimes.health import State
from runtimes.routes_embeddings import router as embeddings_router
from runtimes.routes_generation import router as generation_router
from runtimes.routes_health import router as health_router
from runtimes.settings import Settings
from runtimes.state import ServiceState

log = logging.getLogger("mbuild.runtime")
DRAIN_SECONDS = 25.0


class RequestMetrics:
    """Counts requests and latencies per route template (never per raw path: bounded labels)."""

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app, self.state = app, state
        state.metrics.describe("request_seconds", "Request latency by route")
        state.metrics.describe("requests_total", "Requests by route and status")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        draining = self.state.health.state is State.DRAINING

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if draining:  # no keep-alive while draining: clients reconnect, and find the next replica
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            self.state.metrics.inc("requests_total", route=path, code=str(status))
            self.state.metrics.observe("request_seconds", time.perf_counter() - start, route=path)


def create_app(settings: Settings) -> FastAPI:
    state = ServiceState(settings=settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.load_in_background(asyncio.get_running_loop())
        watcher = asyncio.create_task(watch_drain_flag(state), name="drain-flag")
        yield
        watcher.cancel()
        await drain(state)

    app = FastAPI(title="mbuild model service", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.service = state
    app.include_router(health_router)
    app.include_router(embeddings_router)
    app.include_router(generation_router)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, describe_errors(list(exc.errors())), "invalid_request")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, str(exc.detail), code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal server error", "internal_error", "server_error")

    app.add_middleware(RequestMetrics, state=state)
    return app


async def watch_drain_flag(state: ServiceState, interval: float = 0.1) -> None:
    """The supervisor (PID 1) asks for a drain by creating MBUILD_DRAIN_FLAG; readiness turns 503."""
    flag = os.environ.get("MBUILD_DRAIN_FLAG")
    if not flag:
        return
    while not os.path.exists(flag):
        await asyncio.sleep(interval)
    if state.health.state is not State.DRAINING:
        state.health.move(State.DRAINING, "shutting down")
        log.info("draining: readiness now answers 503; in-flight and new requests are still served")


async def drain(state: ServiceState, timeout: float = DRAIN_SECONDS) -> None:
    """Readiness goes 503 first, in-flight requests finish, then the engine stops."""
    if state.health.state is not State.DRAINING:
        state.health.move(State.DRAINING)
    deadline = time.monotonic() + timeout
    while state.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.embedding is not None:
        await state.embedding.batcher.stop()
    if state.generation is not None:
        state.generation.scheduler.stop()


def app_from_env() -> Any:
    return create_app(Settings.from_env())
