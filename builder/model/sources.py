"""Model references as users type them, parsed into a ModelSpec (nothing resolved yet).

Accepted: a catalog alias (`all-minilm-l6-v2`), `org/name[@rev]`, `hf://org/name[@rev]`,
and a local directory (`./dir`, `/abs/dir`, or any existing folder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError
from builder.model.catalog import load_catalog, lookup_alias, suggest

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


@dataclass(frozen=True)
class ModelSpec:
    """What the user asked for: a hub repo at a revision, or a local folder."""

    repo: str
    revision: str = "main"
    local_path: Path | None = None
    alias: str | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None

    def display(self) -> str:
        if self.local_path is not None:
            return str(self.local_path)
        return f"{self.repo}@{self.revision}"


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or Path(text).is_dir()


def parse_model_ref(text: str) -> ModelSpec:
    text = text.strip()
    if not text:
        raise InputError("empty model reference", hint="give a catalog alias, org/name[@rev] or a folder")
    if text.startswith("hf://"):
        return _parse_repo(text.removeprefix("hf://"), original=text)
    if _looks_like_path(text):
        path = Path(text).expanduser()
        if not path.is_dir():
            raise InputError(f"no such model directory: {path}", hint="check the path, or use org/name for a hub repo")
        if not (path / "config.json").is_file():
            raise InputError(
                f"{path} holds no config.json, so it is not a Hugging Face model folder",
                hint="point at the folder that contains config.json and the weights",
            )
        resolved = path.resolve()
        return ModelSpec(repo=f"local/{resolved.name}", revision="local", local_path=resolved)
    if "/" not in text.split("@", 1)[0]:
        entry = lookup_alias(text)
        if entry is None:
            close = suggest(text)
            hint = f"did you mean {', '.join(close)}?" if close else (
                "known aliases: " + ", ".join(sorted(load_catalog())) + "; or give org/name for any hub repo"
            )
            raise InputError(f"unknown model alias {text!r}", hint=hint)
        return ModelSpec(repo=entry.repo, alias=text.lower())
    return _parse_repo(text, original=text)


def _parse_repo(text: str, original: str) -> ModelSpec:
    repo, _, revision = text.partition("@")
    if not REPO_ID.match(repo):
        raise InputError(
            f"{original!r} is not a valid model reference",
            hint="use org/name, org/name@revision, hf://org/name@revision, a catalog alias or ./folder",
        )
    if "@" in text and not revision:
        raise InputError(f"{original!r} has an empty revision after '@'", hint="write org/name@main or a commit sha")
    if revision and (not REVISION.match(revision) or ".." in revision):
        raise InputError(f"revision {revision!r} is not a branch, tag or commit name",
                         hint="use letters, digits, '.', '_', '-' and '/', e.g. @main, @v1.0 or a 40-hex sha")
    return ModelSpec(repo=repo, revision=revision or "main")
