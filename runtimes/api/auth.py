"""Bearer-token auth when MBUILD_API_KEY is set: every route but the health probes (and metrics, unless
MBUILD_PROTECT_METRICS) needs it. Routers attach `require_key` as a dependency, so no route can forget it.
No key (None) is an open endpoint the start has warned of or been told to allow: settings refuse an empty key.

The header must be exactly `Authorization: Bearer <key>` (scheme case-insensitive, one space, no other
parts); anything else is a 401.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from runtimes.api.errors import ApiError


def _unauthorized() -> ApiError:
    return ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <MBUILD_API_KEY>'",
                    "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_bearer(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    values = request.headers.getlist("authorization")
    if len(values) != 1:
        raise _unauthorized()
    scheme, _, token = values[0].partition(" ")
    # compare_digest keeps the comparison time independent of how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode("utf-8", "replace"),
                                                             api_key.encode()):
        raise _unauthorized()


async def require_key(request: Request) -> None:
    check_bearer(request, request.app.state.service.settings.api_key)


async def require_key_for_metrics(request: Request) -> None:
    settings = request.app.state.service.settings
    if settings.protect_metrics:
        check_bearer(request, settings.api_key)
