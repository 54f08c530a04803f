"""The model bundle a build ships: engine files plus engine.json and metadata.json beside them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class BundleError(Exception):
    """The model folder is missing, incomplete or corrupt."""


@dataclass(frozen=True)
class EngineConfig:
    """engine.json: how to run the compiled model."""

    engine: str
    task: Literal["embedding", "text-generation"]
    model_file: str
    inputs: tuple[str, ...]
    output: str
    dimensions: int
    max_seq_length: int
    pad_token_id: int
    tokenizer_file: str = "tokenizer.json"
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EngineConfig:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        known["inputs"] = tuple(known.get("inputs", ()))
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v)
                for name, v in ((n, getattr(self, n)) for n in self.__dataclass_fields__)}


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise BundleError(f"{path.name} is missing from the model folder {path.parent}") from exc
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{path} does not hold a JSON object")
    return data


def load_engine_config(model_dir: Path) -> EngineConfig:
    try:
        return EngineConfig.from_dict(read_json(model_dir / "engine.json"))
    except TypeError as exc:
        raise BundleError(f"{model_dir / 'engine.json'} lacks a field: {exc}") from exc


def load_metadata(model_dir: Path) -> dict[str, Any]:
    """metadata.json (model, profile, versions) and report.json (validation), both optional at run time."""
    meta: dict[str, Any] = {}
    for name in ("metadata.json", "report.json"):
        path = model_dir / name
        if path.is_file():
            meta[name.removesuffix(".json")] = read_json(path)
    return meta
