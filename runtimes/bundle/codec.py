"""Typed file contracts: a frozen dataclass per JSON file, read and written only through decode/encode.

A contract file carries `"format": N`. decode refuses another format, and any missing or ill-typed field, with
a ContractError naming the file and the field; each reader turns it into its own error (the runtime's
BundleError, the builder's InputError). Fields may be int, float (finite), str, bool, Literal, X | None,
tuple[X, ...], dict[str, X] and nested contract dataclasses; `bounds` limits a number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_NONE = type(None)


class ContractError(Exception):
    """A contract file of another format, or with a missing or ill-typed field."""


def bounds(low: float, high: float) -> dict[str, float]:
    """Field metadata: the number must lie in [low, high]."""
    return {"low": low, "high": high}


def check_format(raw: object, file: str, expected: int) -> None:
    if not isinstance(raw, dict):
        raise ContractError(f"{file} must hold a JSON object (got {type(raw).__name__})")
    found = raw.get("format")
    if type(found) is not int or found != expected:  # true == 1 in Python, not in a format field
        written = ("an older mbuild wrote it, with no format field" if found is None
                   else f"it is format {found!r}")
        raise ContractError(f"{file}: {written}; this mbuild reads format {expected}")


def _kind(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "an object"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}.get(hint, str(hint))


def _value(hint: Any, raw: object, where: str, meta: Mapping[str, Any]) -> Any:
    """raw as hint; where is "file: path.to.field", for the error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if raw is None and _NONE in args:
            return None
        *first, last = [a for a in args if a is not _NONE]
        for inner in first:
            try:
                return _value(inner, raw, where, meta)
            except ContractError:
                continue
        return _value(last, raw, where, meta)
    if dataclasses.is_dataclass(hint):
        return _decode(typing.cast(type, hint), raw, where, {})
    if origin is tuple and isinstance(raw, list):
        return tuple(_value(args[0], item, f"{where}[{i}]", meta) for i, item in enumerate(raw))
    if origin is dict and isinstance(raw, dict):
        return {str(k): _value(args[1], v, f"{where}.{k}", meta) for k, v in raw.items()}
    if origin is typing.Literal and raw in args and type(raw) is type(args[0]):
        return raw
    number = hint in (int, float) and isinstance(raw, (int, float)) and not isinstance(raw, bool)
    if number and (hint is float or isinstance(raw, int)) and math.isfinite(raw):  # type: ignore[arg-type]
        low, high = meta.get("low", -math.inf), meta.get("high", math.inf)
        if not low <= raw <= high:  # type: ignore[operator]
            raise ContractError(f"{where} must lie between {low:g} and {high:g} (got {raw!r})")
        return hint(raw)
    if hint in (str, bool) and type(raw) is hint:
        return raw
    shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
    raise ContractError(f"{where} must be {_kind(hint)} (got {shown})")


def decode(cls: type[T], raw: object, file: str, *, types_: Mapping[str, Any] | None = None) -> T:
    """An instance of the dataclass cls from parsed JSON; file names it in errors. types_ overrides a field's
    declared type (a union another field decides, e.g. engine.json's options by its task)."""
    return _decode(cls, raw, f"{file}:", types_ or {})


def _decode(cls: type[T], raw: object, where: str, types_: Mapping[str, Any]) -> T:
    if not isinstance(raw, dict):
        raise ContractError(f"{where.rstrip(':')} must be a JSON object (got {type(raw).__name__})")
    hints = {**typing.get_type_hints(cls), **types_}
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = f"{where} {spec.name}" if where.endswith(":") else f"{where}.{spec.name}"
        if spec.name in raw:
            values[spec.name] = _value(hints[spec.name], raw[spec.name], path, spec.metadata)
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ContractError(f"{path} is missing")
    return cls(**values)


def encode(value: Any) -> Any:
    """The JSON form of a contract dataclass (tuples as lists, nested dataclasses as objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = sorted((f.name for f in dataclasses.fields(value)), key=lambda n: n != "format")  # format first
        return {name: encode(getattr(value, name)) for name in names}
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


def write_contract(path: Path, contract: Any) -> None:
    """The one way a contract file is written: its JSON form, indented, format first."""
    path.write_text(json.dumps(encode(contract), indent=2) + "\n")
