"""`mbuild cache import`: the air-gapped workflow's first step."""

from __future__ import annotations

from pathlib import Path

import click

from builder.model.cache_import import import_folder
from builder.model.hubcache import hub_cache_dir


@click.group()
def cache() -> None:
    """Work with the local Hugging Face cache."""


@cache.command("import")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option("--repo", required=True, help="The repo id the folder stands for, e.g. sentence-transformers/x.")
@click.option("--revision", help="The commit sha the folder was taken at (default: derived from its content).")
def import_cmd(folder: Path, repo: str, revision: str | None) -> None:
    """Copy FOLDER into the cache as REPO, so offline builds find it."""
    result = import_folder(folder, repo, revision)
    click.echo(f"imported {result.files} files ({result.bytes / 1e6:.1f} MB) as {result.repo}@{result.sha}")
    click.echo(f"cache: {hub_cache_dir()}")
    click.echo(f"next: mbuild package {result.repo} --offline")
