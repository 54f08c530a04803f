"""docs/models.md is generated from the family registry, and the registry is exactly the family test matrix."""

from __future__ import annotations

from pathlib import Path

from builder.model.catalog import load_catalog
from builder.model.families import FAMILIES
from builder.model.models_doc import models_markdown
from tests.support.family_configs import family_configs

DOC = Path(__file__).resolve().parents[4] / "docs" / "models.md"


def test_the_families_built_are_the_family_test_matrix() -> None:
    assert set(FAMILIES) == set(family_configs())


def test_docs_models_md_is_the_generated_page() -> None:
    assert DOC.read_text() == models_markdown(), (
        "docs/models.md is out of date: python -m builder.model.models_doc > docs/models.md")


def test_the_page_names_every_family_and_catalog_alias() -> None:
    text = DOC.read_text()
    assert all(f"| `{name}` |" in text for name in FAMILIES)
    assert all(f"| {alias} |" in text for alias in load_catalog())
