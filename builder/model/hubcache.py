"""The local Hugging Face cache: where it is, and what a repo's refs point at.

Read at call time (not import time) so HF_HOME / HF_HUB_CACHE set by a test or a wrapper apply.
"""

from __future__ import annotations

from pathlib import Path

from builder.settings import host_settings


def hub_cache_dir() -> Path:
    return host_settings().hub_cache


def repo_folder(repo: str) -> Path:
    return hub_cache_dir() / ("models--" + repo.replace("/", "--"))


def cached_commit(repo: str, revision: str) -> str | None:
    """The commit a branch or tag points at in the cache, or the revision itself if it is a cached sha."""
    folder = repo_folder(repo)
    if (folder / "snapshots" / revision).is_dir():
        return revision
    ref = folder / "refs" / revision
    if ref.is_file():
        sha = ref.read_text().strip()
        if (folder / "snapshots" / sha).is_dir():
            return sha
    return None


def hub_endpoint() -> str:
    return host_settings().hub_endpoint


def offline_requested() -> bool:
    return host_settings().hub_offline
