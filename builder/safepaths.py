"""Paths named by inputs (archive manifests, layouts, model folders) stay inside their folder; a file a user names
is read only when it is a regular file, and only up to a bound."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builder.errors import InputError, UnsafeInput


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


def read_regular(path: Path, limit: int, what: str, hint: str) -> bytes:
    """The bytes of the regular file at path, at most limit of them; else an InputError naming `what`. Opened
    without waiting (a FIFO would wait for a writer) and checked before a byte is read (/dev/zero never ends)."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
                raise InputError(f"{what} {path} is {kind}, not a regular file", hint=hint)
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{what} {path}: {exc.strerror}", hint=hint) from exc
    if len(data) > limit:
        raise InputError(f"{what} {path} is over {limit} bytes", hint=hint)
    return data
