"""A model pinned to one commit: what planning needs from the model side, without the hub client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.model.hubcache import hub_endpoint


@dataclass(frozen=True)
class ModelRef:
    """A model pinned to one commit, with the exact files a build uses."""

    repo: str
    revision: str
    sha: str | None  # None only in a plan made without Hub or cache access (pinned at package time)
    files: tuple[str, ...]
    alias: str | None = None
    local_path: Path | None = None  # set for local folders; cache snapshots are found by pull()
    note: str = ""  # why the ref is unresolved, when it is

    def page(self) -> str:
        return f"{hub_endpoint()}/{self.repo}"
