"""Paths named by inputs (archive manifests, layouts, model folders) stay inside their folder."""

from __future__ import annotations

from pathlib import Path

from builder.errors import UnsafeInput


def inside(root: Path, name: str, what: str) -> Path:
    """root/name, after following links, if it stays inside root; else an UnsafeInput naming `what`."""
    base = root.resolve()
    if Path(name).is_absolute() or "\\" in name:
        raise UnsafeInput(f"{what}: {name!r} is an absolute path; only names inside the archive are read")
    target = (base / name).resolve()
    if not target.is_relative_to(base):
        raise UnsafeInput(f"{what}: {name!r} leads outside its folder (to {target}); refusing to read it",
                          hint="the archive or folder was made by a tool that should not be trusted")
    return target


def stays_inside(root: Path, path: Path) -> bool:
    """True when path, links followed, is inside root."""
    return path.resolve().is_relative_to(root.resolve())
