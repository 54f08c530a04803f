"""Bearer-token auth for inference routes when MBUILD_API_KEY is set."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from runtimes.api.errors import ApiError


def check_bearer(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    # compare_digest keeps the comparison time independent of how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <MBUILD_API_KEY>'",
                       "invalid_api_key", "authentication_error", headers={"WWW-Authenticate": "Bearer"})
