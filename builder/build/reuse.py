"""Rebuilds with unchanged inputs reuse the finished build: the marker names the plan digest."""

from __future__ import annotations

from pathlib import Path

MARKER = ".mbuild-complete"


def finished_digest(build_dir: Path) -> str | None:
    try:
        return (build_dir / MARKER).read_text().strip() or None
    except OSError:
        return None


def mark_finished(build_dir: Path, digest: str) -> None:
    (build_dir / MARKER).write_text(digest + "\n")


def forget(build_dir: Path) -> None:
    (build_dir / MARKER).unlink(missing_ok=True)
