"""The model catalog (profiles/catalog.yaml): aliases, repos, and the facts planning needs offline."""

from __future__ import annotations

import difflib
from functools import cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.errors import InputError
from builder.resources import resource_dir

Task = Literal["embedding", "text-generation"]


class ModelFacts(BaseModel):
    """Architecture facts for memory planning; from the catalog, or estimated from config.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Task
    params: float = Field(gt=0, description="parameters, in billions")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    context: int = Field(gt=0, description="longest sequence served by default")
    vocab: int = Field(gt=0)
    tied: bool = False  # the LM head shares the token table (tie_word_embeddings)
    source: str = "catalog"


class CatalogEntry(ModelFacts):
    repo: str
    gated: bool = False

    def facts(self) -> ModelFacts:
        return ModelFacts.model_validate(self.model_dump(exclude={"repo", "gated"}))


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


def entry_for_repo(repo: str) -> tuple[str, CatalogEntry] | None:
    for alias, entry in load_catalog().items():
        if entry.repo.lower() == repo.lower():
            return alias, entry
    return None


def suggest(alias: str) -> list[str]:
    return difflib.get_close_matches(alias.lower(), list(load_catalog()), n=3, cutoff=0.5)
