"""The model catalog (profiles/catalog.yaml): aliases and the facts planning needs offline."""

from __future__ import annotations

import difflib
from functools import cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from builder.errors import InputError
from builder.resources import resource_dir

Task = Literal["embedding", "text-generation"]


class CatalogEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str
    task: Task
    gated: bool = False
    params: float  # billions
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    vocab: int


@cache
def load_catalog() -> dict[str, CatalogEntry]:
    path = resource_dir("profiles") / "catalog.yaml"
    raw = yaml.safe_load(path.read_text())
    try:
        return {alias: CatalogEntry.model_validate(entry) for alias, entry in raw["models"].items()}
    except ValidationError as exc:
        raise InputError(f"{path}: invalid catalog entry:\n{exc}") from exc


def lookup_alias(alias: str) -> CatalogEntry | None:
    return load_catalog().get(alias.lower())


def alias_for_repo(repo: str) -> str | None:
    for alias, entry in load_catalog().items():
        if entry.repo.lower() == repo.lower():
            return alias
    return None


def suggest(alias: str) -> list[str]:
    return difflib.get_close_matches(alias.lower(), list(load_catalog()), n=3, cutoff=0.5)
