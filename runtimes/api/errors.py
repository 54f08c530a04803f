"""Errors as the API returns them: {"error": {"message", "type", "code"}} with a fitting status."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, type_: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type_
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.code, self.type, self.headers)


def error_response(status: int, message: str, code: str, type_: str = "invalid_request_error",
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def overloaded() -> ApiError:
    """The bounded queue is full: the caller should back off, not count it as a server failure."""
    return ApiError(429, "the server is at capacity; retry shortly", "overloaded", "rate_limit_error",
                    headers={"Retry-After": "1"})


def timed_out(seconds: float) -> ApiError:
    return ApiError(503, f"the request waited longer than {seconds:g} s (MBUILD_REQUEST_TIMEOUT); retry shortly",
                    "timeout", "service_unavailable", headers={"Retry-After": "1"})
