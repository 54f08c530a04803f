"""The ASGI application: routes, error mapping, request metrics, and the load/drain lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from runtimes import __version__
from runtimes.api import chat, completions, embeddings, kserve, probes, rerank, tokenize_routes
from runtimes.api.bodies import add_request_components, describe_errors
from runtimes.api.errors import ApiError, shape_of
from runtimes.api.middleware import RequestContext
from runtimes.health import State
from runtimes.settings import Settings
from runtimes.startup import Timeline
from runtimes.state import ServiceState

log = logging.getLogger("mbuild.runtime")


def create_app(settings: Settings, timeline: Timeline | None = None) -> FastAPI:
    """timeline: the start's, which the server process began (runtimes/server.py); its phases are logged at ready."""
    state = ServiceState(settings=settings, timeline=timeline or Timeline.of_process())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.timeline.mark("app")
        state.load_in_background(asyncio.get_running_loop())
        watcher = asyncio.create_task(watch_drain_flag(state), name="drain-flag")
        yield
        watcher.cancel()
        await drain(state)

    # /docs and /openapi.json are routes of our own (probes.py), behind the API key like the rest.
    app = FastAPI(title="mbuild model service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = state
    routers = (probes.health, probes.metrics_router, probes.router, embeddings.router, rerank.router, chat.router,
               completions.router, tokenize_routes.router, kserve.probes, kserve.router)
    for router in routers:
        app.include_router(router)

    # Routes render their own API's shape; these answer the rest (no route, or raised outside one) by the path.
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response(shape_of(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await api_error(request, ApiError(400, describe_errors(list(exc.errors())), "invalid_request"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return await api_error(request, ApiError(exc.status_code, str(exc.detail), code, headers=exc.headers))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return await api_error(request, ApiError(500, "internal server error", "internal_error"))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    async def not_found(path: str, request: Request) -> JSONResponse:
        # Registered last. Under BentoML it also makes unknown paths reach this app (BentoML mounts it
        # passively, only for paths some route matches), so they get a JSON 404 like every other error.
        allowed = sorted({method for router in routers for route in router.routes
                          if route.matches(request.scope)[0] is Match.PARTIAL
                          for method in getattr(route, "methods", ()) or ()})
        if allowed:
            raise ApiError(405, "Method Not Allowed", "method_not_allowed", headers={"Allow": ", ".join(allowed)})
        raise ApiError(404, f"no route /{path}; see /docs for the API", "not_found")

    app.add_middleware(RequestContext, state=state)
    generate_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_request_components(generate_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def watch_drain_flag(state: ServiceState, interval: float = 0.1) -> None:
    """The supervisor (PID 1) asks for a drain by creating MBUILD_DRAIN_FLAG; readiness turns 503."""
    flag = state.settings.drain_flag
    if flag is None:
        return
    while not flag.exists():
        await asyncio.sleep(interval)
    if state.health.state is not State.DRAINING:
        state.health.move(State.DRAINING, "shutting down")
        log.info("draining: readiness now answers 503; in-flight and new requests are still served")


async def drain(state: ServiceState) -> None:
    """Readiness goes 503 first, in-flight requests finish (within the supervisor's grace), then the engine
    stops, ending whatever is left with an event rather than silently."""
    if state.health.state is not State.DRAINING:
        state.health.move(State.DRAINING)
    deadline = time.monotonic() + state.settings.in_flight_seconds
    while state.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for encoder in (state.embedding, state.ranking):
        if encoder is not None:
            await encoder.batcher.stop()
    if state.generation is not None:
        state.generation.engine_loop.stop()

