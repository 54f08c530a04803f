"""Content hashes used for cache blobs, lock files and plan digests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The id git (and the Hub) gives a non-LFS file: sha1 of 'blob <size>\\0' + content."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def tree_digest(root: Path, exclude: tuple[str, ...] = ("__pycache__",)) -> str:
    """sha256 over every file's relative path and content under root, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if any(part in exclude or part.endswith(".pyc") for part in rel.parts):
            continue
        digest.update(f"{rel.as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()
