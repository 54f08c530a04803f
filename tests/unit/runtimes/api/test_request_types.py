"""Every field of every request body takes only its JSON type, as OpenAI's API checks them: a boolean is true or
false (never "yes", "false" or 1), a number is a number (never "5", and never true for 1). pydantic's lax mode
took all of those, so `"parallel_tool_calls": "yes"` meant true and `"stream": "false"` meant... true."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from runtimes.api import schemas, schemas_generation, tokenize_routes

# A smallest valid body of each request model (and of each nested one a request carries).
MINIMAL: dict[type[BaseModel], dict[str, Any]] = {
    schemas_generation.ChatCompletionRequest: {"messages": [{"role": "user", "content": "hi"}]},
    schemas_generation.CompletionRequest: {"prompt": "hi"},
    schemas_generation.SamplingFields: {},
    schemas_generation.StreamOptions: {},
    schemas_generation.FunctionDef: {"name": "f"},
    schemas_generation.JsonSchemaFormat: {},
    schemas.EmbeddingRequest: {"input": "hi"},
    tokenize_routes.TokenizeRequest: {"prompt": "hi"},
    tokenize_routes.DetokenizeRequest: {"tokens": [1]},
}
MODULES = (schemas, schemas_generation, tokenize_routes)


def _members(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return {m for arg in typing.get_args(annotation) for m in _members(arg)}
    return {annotation}


def _fields(kind: type) -> list[tuple[type[BaseModel], str]]:
    """(model, field) for every field of the request models whose type is `kind` (alone or with None)."""
    found = []
    for module in MODULES:
        for _, model in inspect.getmembers(module, inspect.isclass):
            # Private models are parts of the bodies above (tested through them); responses are not read.
            if (issubclass(model, BaseModel) and model.__module__ == module.__name__
                    and not model.__name__.startswith("_") and not model.__name__.endswith(("Response", "Data"))
                    and model is not schemas.Usage):
                found += [(model, name) for name, field in model.model_fields.items()
                          if _members(field.annotation) - {type(None)} == {kind}]
    return found


def test_every_model_with_such_fields_has_a_minimal_body() -> None:
    for model, _ in _fields(bool) + _fields(int) + _fields(float):
        assert model in MINIMAL, model


@pytest.mark.parametrize(("model", "field"), _fields(bool), ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("value", ["yes", "true", "false", 1, 0])
def test_booleans_are_json_booleans(model: type[BaseModel], field: str, value: Any) -> None:
    model.model_validate({**MINIMAL[model], field: True})  # the field is real and takes a boolean
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**MINIMAL[model], field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(("model", "field"), _fields(int) + _fields(float), ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("value", ["1", True])
def test_numbers_are_json_numbers(model: type[BaseModel], field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**MINIMAL[model], field: value})
    assert caught.value.errors()[0]["loc"][0] == field


def test_the_fields_found_include_the_ones_the_audit_named() -> None:
    named = {f for _, f in _fields(bool)}
    assert {"parallel_tool_calls", "stream", "logprobs", "echo", "include_usage", "strict", "ignore_eos",
            "skip_special_tokens", "add_special_tokens"} <= named
