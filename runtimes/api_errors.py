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
