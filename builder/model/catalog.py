"""The model catalog (profiles/catalog.yaml): aliases, repos, and the facts planning needs offline.

A language model's entry records the config.json fields that decide its plan, under the names the model card's
config.json uses; its facts are derived from them as from a downloaded config.json (builder/model/shape.py).
Encoders, which no family derivation covers, record their facts as published.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from builder.errors import InputError, MbuildError
from builder.model.shape import ModelFacts, Task, facts_from_config
from builder.resources import resource_dir

__all__ = ["CatalogEntry", "ModelFacts", "Task", "entry_for_repo", "load_catalog", "lookup_alias", "suggest"]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str
    task: Task
    gated: bool = False
    config: dict[str, Any] | None = None  # config.json's fields, as the model card has them
    facts: dict[str, Any] | None = None  # ModelFacts' fields, for entries without a config

    @model_validator(mode="after")
    def _one_source(self) -> _Entry:
        if (self.config is None) == (self.facts is None):
            raise ValueError("give either config (config.json's fields) or facts, not both or neither")
        return self


@dataclass(frozen=True)
class CatalogEntry:
    alias: str
    repo: str
    gated: bool
    task: Task
    config: dict[str, Any] | None = None  # what known is derived from, for entries that record it
    recorded: dict[str, Any] | None = None  # ModelFacts' fields, for entries without a config

    @cached_property
    def known(self) -> ModelFacts:
        """The entry's facts, derived when first asked: a family the generic export builds is read through
        transformers' config classes in a child process (builder/model/torch_free.py), seconds an entry, which
        every command that loads the catalog would otherwise pay for entries it never looks at."""
        if self.config is None:
            return ModelFacts.model_validate({**(self.recorded or {}), "task": self.task})
        try:
            return facts_from_config(self.config, self.task, source="catalog")
        except MbuildError as exc:  # a config the derivation refuses (a family mbuild does not build)
            raise InputError(f"{_path()}: catalog entry {self.alias}: {exc.message}", hint=exc.hint) from exc

    def facts(self) -> ModelFacts:
        return self.known


def _path() -> Path:
    return resource_dir("profiles") / "catalog.yaml"


@cache
def load_catalog() -> dict[str, CatalogEntry]:
    path = _path()
    raw = yaml.safe_load(path.read_text())
    entries: dict[str, CatalogEntry] = {}
    for alias, entry in raw["models"].items():
        try:
            valid = _Entry.model_validate(entry)
        except ValidationError as exc:
            raise InputError(f"{path}: invalid catalog entry {alias}:\n{exc}") from exc
        entries[alias] = CatalogEntry(alias, valid.repo, valid.gated, valid.task, valid.config, valid.facts)
    return entries


def lookup_alias(alias: str) -> CatalogEntry | None:
    return load_catalog().get(alias.lower())


def entry_for_repo(repo: str) -> tuple[str, CatalogEntry] | None:
    for alias, entry in load_catalog().items():
        if entry.repo.lower() == repo.lower():
            return alias, entry
    return None


def suggest(alias: str) -> list[str]:
    return difflib.get_close_matches(alias.lower(), list(load_catalog()), n=3, cutoff=0.5)
