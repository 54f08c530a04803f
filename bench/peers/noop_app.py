"""The bare baseline for the serving benchmark: Starlette on uvicorn, no model, a fixed answer."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from runtimes.health import LIVE

ANSWER = {"object": "list", "data": [], "model": "none", "usage": {"prompt_tokens": 0, "total_tokens": 0}}


async def embeddings(request: Request) -> JSONResponse:
    await request.body()  # read it, as any real handler must
    return JSONResponse(ANSWER)


async def live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "live"})


app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]), Route(LIVE, live)])
