"""One error model for every route: an ApiError carries the status, and each API renders it in its shape.

OpenAI routes answer {"error": {"message", "type", "code"}}; KServe V2 routes answer {"error": "..."}.
The shape follows the route (its router's route class), not the URL.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error",
          499: "invalid_request_error", 503: "service_unavailable", 504: "timeout_error"}


class ApiError(Exception):
    """A request that cannot be answered: what went wrong, for whom (the status), and what to do."""

    def __init__(self, status: int, message: str, code: str, type_: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.code, self.type, self.headers)

    def v2_response(self) -> JSONResponse:
        return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)


def error_response(status: int, message: str, code: str, type_: str = "invalid_request_error",
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


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


def client_closed() -> ApiError:
    return ApiError(499, "the client closed the request", "client_closed")


class OpenAIRoute(APIRoute):
    """Routes whose errors take the OpenAI shape."""

    def render(self, exc: ApiError) -> Response:
        return exc.response()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:  # dependencies (auth) raise inside the handler too
                return self.render(exc)

        return handle


class V2Route(OpenAIRoute):
    """KServe V2 / Open Inference Protocol routes: errors as {"error": "..."} with Triton's statuses."""

    def render(self, exc: ApiError) -> Response:
        return exc.v2_response()
