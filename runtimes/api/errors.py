"""One error model for every route: an ApiError carries the status, and `body` is the one place that renders it,
for a JSON response and a streamed SSE error event alike.

OpenAI routes answer {"error": {"message", "type", "code"}}; KServe V2 routes answer {"error": "..."}.
The shape follows the route (its router's route class); before routing (middleware.py) it follows the path.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from enum import Enum
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtimes.generation.sampling_request import InvalidSampling
from runtimes.generation.stream import GenerationFailed

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error",
          499: "invalid_request_error", 503: "service_unavailable", 504: "timeout_error"}


class Shape(Enum):
    OPENAI = "openai"  # /v1: {"error": {"message", "type", "code"}}
    V2 = "v2"  # /v2, KServe V2 as tritonclient reads it: {"error": "..."}


def shape_of(path: str) -> Shape:
    """Only for answers given before a route is matched; a route's own errors take its route class's shape."""
    if path == "/v2/rerank":  # Cohere's v2 path, beside KServe's: its errors are the other routes' shape
        return Shape.OPENAI
    return Shape.V2 if path == "/v2" or path.startswith("/v2/") else Shape.OPENAI


class ApiError(Exception):
    """A request that cannot be answered: what went wrong, for whom (the status), and what to do."""

    def __init__(self, status: int, message: str, code: str, type_: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = dict(headers) if headers else None

    def body(self, shape: Shape = Shape.OPENAI) -> dict[str, Any]:
        if shape is Shape.V2:
            return {"error": self.message}
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}

    def response(self, shape: Shape = Shape.OPENAI) -> JSONResponse:
        return JSONResponse(self.body(shape), status_code=self.status, headers=self.headers)


def bad_request(message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, code)


def overloaded() -> ApiError:
    """The bounded queue is full: the caller should back off, not count it as a server failure."""
    return ApiError(429, "the server is at capacity; retry shortly", "overloaded", headers={"Retry-After": "1"})


def queue_timeout(seconds: float) -> ApiError:
    """Nothing ran yet: retrying elsewhere or later repeats no work."""
    return ApiError(503, f"the request waited longer than {seconds:g} s for the engine (MBUILD_REQUEST_TIMEOUT); "
                         "retry shortly", "timeout", headers={"Retry-After": "1"})


def deadline_exceeded(seconds: float) -> ApiError:
    """It was running when time ran out: a retry would repeat the same work, so no Retry-After."""
    return ApiError(504, f"the request ran longer than {seconds:g} s (MBUILD_REQUEST_TIMEOUT) and was stopped; "
                         "ask for less (max_tokens, fewer inputs) or raise the limit", "deadline_exceeded")


def stream_deadline_exceeded(seconds: float) -> ApiError:
    return ApiError(504, f"the stream ran longer than {seconds:g} s (MBUILD_STREAM_TIMEOUT) and was stopped",
                    "deadline_exceeded")


def client_closed() -> ApiError:
    return ApiError(499, "the client closed the request", "client_closed")


def generation_failed(exc: GenerationFailed) -> ApiError:
    """The one status for a sequence the scheduler failed, answered whole or as a stream's last event: the
    request's own output constraint that could not go on is the caller's 400, anything else the server's 500."""
    if exc.refused:
        return ApiError(400, f"{exc}; simplify the output constraint", "constraint_failed")
    return ApiError(500, str(exc), "generation_failed")


class OpenAIRoute(APIRoute):
    """Routes whose errors take the OpenAI shape."""

    shape = Shape.OPENAI

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:  # dependencies (auth) raise inside the handler too
                return exc.response(self.shape)
            except InvalidSampling as exc:  # the sampling check every front door shares: the caller's 400
                return bad_request(str(exc), exc.code).response(self.shape)

        return handle


class V2Route(OpenAIRoute):
    """KServe V2 / Open Inference Protocol routes: errors as {"error": "..."} with Triton's statuses."""

    shape = Shape.V2
