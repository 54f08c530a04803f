"""Reading JSON request bodies: any content type, clear 400s for bad JSON, bad UTF-8 and bad fields."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from runtimes.api.errors import ApiError, client_closed

Model = TypeVar("Model", bound=BaseModel)


def describe_errors(errors: list[Any]) -> str:
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        # Unknown fields are refused, never ignored: say so in words, naming the field.
        msg = "this server does not implement this field; remove it" if err.get("type") == "extra_forbidden" \
            else err.get("msg", "invalid")
        parts.append(f"{where}: {msg}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


def describe(exc: ValidationError) -> str:
    # Without inputs, URLs and contexts: a wrong list of 100k items would otherwise copy each item's error.
    return describe_errors(exc.errors(include_url=False, include_context=False, include_input=False))


MAX_DEPTH = 32  # no request body of any route nests deeper; json and pydantic recurse, so refuse early
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BodyError(ValueError):
    """A body that is not acceptable JSON: the caller's mistake, whichever API's shape reports it."""

    def __init__(self, message: str, code: str = "invalid_json") -> None:
        super().__init__(message)
        self.code = code


def _check_tree(data: Any, strings: bool) -> None:
    """Depth within MAX_DEPTH, and (strings) no lone surrogate in any string: tokenizers and encoders choke."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BodyError(f"the JSON nests deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        keys = node.keys() if isinstance(node, dict) and strings else ()
        for text in (*keys, *(c for c in children if strings and isinstance(c, str))):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BodyError("the JSON holds a lone UTF-16 surrogate (\\ud800-\\udfff) that is not text; "
                                "send valid Unicode") from exc
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def load_json(raw: bytes) -> Any:
    """JSON from bytes, with every way it can fail as a BodyError that says what to fix."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError("the request body is not valid UTF-8", "invalid_encoding") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BodyError(f"the request body is not valid JSON: {exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise BodyError(f"the JSON nests deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # Python refuses integers of more than 4300 digits
        raise BodyError("the request body holds a number of more than 4300 digits") from exc
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if surrogates or raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        _check_tree([data], surrogates)  # wrapped, so a bare string is checked like any other
    return data


async def read_limited(request: Request, limit: int, timeout: float) -> bytes:
    """The body, refused with 413 once it passes limit (also for chunked bodies with no Content-Length),
    and with 408 when it takes longer than timeout to arrive (a slow client holds no worker forever)."""
    chunks, size = [], 0

    async def receive() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes (MBUILD_MAX_BODY_BYTES)",
                               "body_too_large")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive(), timeout)
    except ClientDisconnect as exc:  # gone while sending: nobody to answer, and not the server's fault
        raise client_closed() from exc
    except TimeoutError as exc:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (MBUILD_BODY_TIMEOUT)",
                       "body_timeout") from exc
    return b"".join(chunks)


async def read_body(request: Request) -> bytes:
    settings = request.app.state.service.settings
    raw = await read_limited(request, settings.max_body_bytes, settings.body_timeout)
    if await request.is_disconnected():  # sent in full and gone: parsing it would be work for nobody
        raise client_closed()
    return raw


async def parse_body(request: Request, model: type[Model]) -> Model:
    # curl -d sends form encoding by default; the body is still JSON, so read it as JSON regardless.
    raw = await read_body(request)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", "empty_body")
    try:
        data = load_json(raw)
    except BodyError as exc:
        raise ApiError(400, str(exc), exc.code) from exc
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}", "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, describe(exc), "invalid_request") from exc


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
