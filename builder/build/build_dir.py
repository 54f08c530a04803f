"""The build directory: the names mbuild writes there, and claiming a folder before writing anything.

mbuild deletes and rewrites its own outputs (model/, work/, oci/ ...) on every build, so it builds only
into a new or empty folder, or one an earlier build marked as its own; a user's folder needs --force,
and even then none of mbuild's names may already be taken there.
"""

from __future__ import annotations

import errno
from pathlib import Path

from builder.errors import OutputUnusable

MARKER = ".mbuild-build"  # written first: this folder is mbuild's, it may rewrite what it wrote here
# Everything a build writes at the top of its folder (the context, the engine, the records).
OWN_NAMES = frozenset({
    MARKER, ".mbuild-complete", ".dockerignore", "Dockerfile", "app", "bom.json", "image-build.log",
    "image-spec.json", "image.json", "mbuild.lock", "model", "oci", "plan.json", "report.json",
    "requirements.txt", "site", "tensorrt.json", "work",
})


def _is_ours(build_dir: Path) -> bool:
    return (build_dir / MARKER).is_file() or (build_dir / ".mbuild-complete").is_file()


def _check_parents(build_dir: Path) -> None:
    for folder in [build_dir, *build_dir.parents]:
        if folder.exists() and not folder.is_dir():
            raise OutputUnusable(f"cannot build into {build_dir}: {folder} is a file, not a folder",
                                 hint="give --output a folder path that no file is in the way of")


def _check_contents(build_dir: Path, force: bool) -> None:
    entries = sorted(entry.name for entry in build_dir.iterdir())
    if not entries or _is_ours(build_dir):
        return
    shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
    if not force:
        raise OutputUnusable(f"{build_dir} is not empty and not an mbuild build ({shown}); refusing to write there",
                             hint="choose a new or empty --output folder, or add --force to build beside "
                                  "these files (mbuild never deletes them)")
    taken = [name for name in entries if name in OWN_NAMES]
    if taken:
        raise OutputUnusable(f"{build_dir} already holds {', '.join(taken)}, which a build would overwrite",
                             hint="move those away or choose another --output folder")


def claim(build_dir: Path, force: bool = False) -> None:
    """Make build_dir mbuild's, or raise OutputUnusable saying why not and what to do."""
    _check_parents(build_dir)
    if build_dir.is_dir():
        _check_contents(build_dir, force)
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / MARKER).write_text("written by mbuild; it may rewrite its files in this folder\n")
    except OSError as exc:
        reason = "it is read-only or you may not write there" if exc.errno in {errno.EACCES, errno.EPERM,
                                                                                 errno.EROFS} else exc.strerror
        raise OutputUnusable(f"cannot write the build directory {build_dir}: {reason}",
                             hint="give --output a folder you can write, e.g. --output ./mbuild-build") from exc
