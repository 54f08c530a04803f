"""Health, model listing, metadata, metrics and the API document (NIM names; /health as vLLM and TGI name
it, which benchmark clients such as guidellm probe before they start).

Health stays open for probes; metrics need the key only with MBUILD_PROTECT_METRICS; the rest needs it."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse

from runtimes import __version__
from runtimes.api.admission import check_model
from runtimes.api.auth import require_key, require_key_for_metrics
from runtimes.api.errors import OpenAIRoute
from runtimes.api.schemas import Metadata
from runtimes.bundle.codec import encode
from runtimes.health import LIVE, METRICS, READY
from runtimes.state import ServiceState

health = APIRouter(route_class=OpenAIRoute)
router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])
metrics_router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key_for_metrics)])
_STARTED = int(time.time())


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


@health.get(LIVE, tags=["health"])
async def live() -> dict[str, str]:
    return {"status": "live"}


@health.get(READY, tags=["health"], responses={503: {"description": "not ready yet, or failed"}})
@health.get("/health", tags=["health"], responses={503: {"description": "not ready yet, or failed"}})
async def ready(request: Request) -> JSONResponse:
    health = _state(request).health
    body = {"status": health.state.value}
    if health.reason:
        body["reason"] = health.reason
    return JSONResponse(body, status_code=200 if health.ready else 503)


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "mbuild"}


@router.get("/v1/models", tags=["models"])
async def models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(_state(request).served_names()[0])]}


@router.get("/v1/models/{model:path}", tags=["models"], responses={404: {"description": "no such model here"}})
async def model(model: str, request: Request) -> dict[str, Any]:
    """One model, by any name a request may use for it (OpenAI's retrieve; org/name ids keep their slash)."""
    check_model(_state(request), model)
    return _model_card(model)


@router.get("/v1/version", tags=["models"])
async def version() -> dict[str, str]:
    """NIM's version route: the runtime's release and the API it serves."""
    return {"release": __version__, "api": "1.0.0"}


@router.get("/v1/manifest", tags=["models"])
async def manifest(request: Request) -> dict[str, Any]:
    """NIM's manifest route: the model, the profile the image carries and what it requires of the host."""
    meta = _state(request).metadata
    if meta is None:
        return {"model": {}, "profiles": [], "requires": {}, "image": None, "plan_digest": None}
    return {"model": encode(meta.model), "profiles": [encode(meta.profile)], "requires": meta.requires.to_dict(),
            "image": meta.image, "plan_digest": meta.plan_digest}


@router.get("/v1/metadata", tags=["models"])
async def metadata(request: Request) -> Metadata:
    state = _state(request)
    meta = state.metadata
    return Metadata(name=state.served_names()[0], model=meta.model if meta else None,
                    profile=meta.profile if meta else None, engine=state.config,
                    validation=state.report.headline() if state.report else {},
                    versions={**(meta.versions if meta else {}), "runtime": __version__},
                    status=state.health.state.value)


@metrics_router.get(METRICS, tags=["health"], response_class=PlainTextResponse)
@metrics_router.get("/metrics", tags=["health"], response_class=PlainTextResponse)  # Prometheus' default path
async def metrics(request: Request) -> PlainTextResponse:
    state = _state(request)
    state.metrics.set("ready", 1.0 if state.health.ready else 0.0)
    if state.generation is not None:  # gauges read from the scheduler's state now, never stale
        state.generation.engine_loop.refresh_metrics()
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="mbuild model service")
