"""Health, model listing, metadata and metrics routes (NIM names; /health as vLLM and TGI name it, which
benchmark clients such as guidellm probe before they start)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse

from runtimes import __version__
from runtimes.api.auth import check_bearer
from runtimes.state import ServiceState

router = APIRouter()
_STARTED = int(time.time())


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


@router.get("/v1/health/live", tags=["health"])
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get("/v1/health/ready", tags=["health"], responses={503: {"description": "not ready yet, or failed"}})
@router.get("/health", tags=["health"], responses={503: {"description": "not ready yet, or failed"}})
async def ready(request: Request) -> JSONResponse:
    health = _state(request).health
    body = {"status": health.state.value}
    if health.reason:
        body["reason"] = health.reason
    return JSONResponse(body, status_code=200 if health.ready else 503)


@router.get("/v1/models", tags=["models"])
async def models(request: Request) -> dict[str, Any]:
    name = _state(request).served_names()[0]
    return {"object": "list", "data": [{"id": name, "object": "model", "created": _STARTED, "owned_by": "mbuild"}]}


@router.get("/v1/metadata", tags=["models"])
async def metadata(request: Request) -> dict[str, Any]:
    state = _state(request)
    meta = state.metadata.get("metadata", {})
    report = state.metadata.get("report", {})
    return {
        "name": state.served_names()[0],
        "model": meta.get("model", {}),
        "profile": meta.get("profile", {}),
        "engine": state.config.to_dict() if state.config else None,
        "validation": {k: report.get(k) for k in ("passed", "summary", "min_cosine", "max_abs_diff", "greedy_equal",
                                                  "top1_agreement", "tolerance") if k in report},
        "versions": {**meta.get("versions", {}), "runtime": __version__},
        "status": state.health.state.value,
    }


@router.get("/v1/metrics", tags=["health"], response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    state = _state(request)
    if state.settings.protect_metrics:
        check_bearer(request, state.settings.api_key)
    state.metrics.set("ready", 1.0 if state.health.ready else 0.0)
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
