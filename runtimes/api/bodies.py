"""Reading JSON request bodies: any content type, clear 400s for bad JSON, bad UTF-8 and bad fields."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from runtimes.api.errors import ApiError

Model = TypeVar("Model", bound=BaseModel)


def describe_errors(errors: list[Any]) -> str:
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes limit (also for chunked bodies with no Content-Length)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes (MBUILD_MAX_BODY_BYTES)",
                           "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[Model]) -> Model:
    # curl -d sends form encoding by default; the body is still JSON, so read it as JSON regardless.
    raw = await read_limited(request, request.app.state.service.settings.max_body_bytes)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", "empty_body")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, "the request body is not valid UTF-8", "invalid_encoding") from exc
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc.msg} at position {exc.pos}",
                       "invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}", "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, describe_errors(exc.errors()), "invalid_request") from exc


REQUEST_MODELS: list[type[BaseModel]] = []  # their nested schemas go into the document's components


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """The requestBody entry FastAPI would write, for routes that parse their body themselves."""
    REQUEST_MODELS.append(model)
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def add_request_components(document: dict[str, Any]) -> dict[str, Any]:
    """Register the nested models the request bodies refer to, so every $ref in the document resolves."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in REQUEST_MODELS:
        for name, definition in model.model_json_schema(ref_template="#/components/schemas/{model}").get(
                "$defs", {}).items():
            schemas.setdefault(name, definition)
    return document
