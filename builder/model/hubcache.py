"""The local Hugging Face cache: where it is, and what a repo's refs point at.

Read at call time (not import time) so HF_HOME / HF_HUB_CACHE set by a test or a wrapper apply.
"""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


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
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_requested() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
