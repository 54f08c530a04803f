"""The folder a sweep writes (--output). `mbuild bench` writes only into a new or empty folder, or one an earlier
bench listed as its own; there it replaces only what that run listed. Anything else in the folder is the user's:
the folder is refused before any work, and nothing in it is removed, written or followed (a link is never ours)."""

from __future__ import annotations

import errno
import json
import shutil
import stat
from pathlib import Path

from builder.benchmark.report import CSV_FILE, FRONTIER_PNG, LATENCY_PNG
from builder.benchmark.result import RESULT_FILE
from builder.errors import OutputUnusable

MANIFEST = ".mbuild-bench"  # what the run writing this folder wrote there: the names it may replace next time
AIPERF, TOKENIZER, SERVER_LOG, PROMPTS = "aiperf", "tokenizer", "server.log", "prompts.jsonl"
FOLDERS = frozenset({AIPERF, TOKENIZER})
NAMES = FOLDERS | {RESULT_FILE, CSV_FILE, FRONTIER_PNG, LATENCY_PNG, SERVER_LOG, PROMPTS}
MAX_MANIFEST_BYTES = 1 << 16
HINT = "choose a new or empty --output folder, or move those away; `mbuild bench` never removes what it did not write"


class Output:
    """A claimed folder: an entry is listed in the manifest as the run asks for its path, before it is written."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._written: set[str] = set()
        self._save()

    def path(self, name: str) -> Path:
        if name not in NAMES:
            raise ValueError(f"{name} is not a name `mbuild bench` writes")
        if name not in self._written:
            self._written.add(name)
            self._save()
        return self.folder / name

    def _save(self) -> None:
        (self.folder / MANIFEST).write_text(json.dumps({"format": 1, "written": sorted(self._written)}) + "\n")


def _listed(folder: Path) -> set[str] | None:
    """The names an earlier run listed, of those bench writes (a forged list names no file of the user's); None
    where the manifest is missing, a link, or not one bench wrote."""
    manifest = folder / MANIFEST
    try:
        if not stat.S_ISREG(manifest.lstat().st_mode) or manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        raw = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    written = raw.get("written") if isinstance(raw, dict) and raw.get("format") == 1 else None
    if not isinstance(written, list):
        return None
    return {name for name in written if isinstance(name, str)} & NAMES


def _is_ours(entry: Path, listed: set[str]) -> bool:
    """Listed, and of the kind bench writes there (lstat: a link is never followed, and never ours)."""
    if entry.name not in listed:
        return False
    mode = entry.lstat().st_mode
    return stat.S_ISDIR(mode) if entry.name in FOLDERS else stat.S_ISREG(mode)


def _owned(out: Path) -> list[Path]:
    """The entries of out an earlier bench wrote (to replace); OutputUnusable where any other is there."""
    if out.exists() and not out.is_dir():
        raise OutputUnusable(f"--output {out} is a file", hint="give a folder for the results")
    if not out.is_dir():
        return []
    try:
        entries = [entry for entry in out.iterdir() if entry.name != MANIFEST]
        listed = _listed(out) if entries else set()
        foreign = sorted(e.name + (" (a link)" if e.is_symlink() else "") for e in entries
                         if listed is None or not _is_ours(e, listed))
    except OSError as exc:
        raise OutputUnusable(f"cannot read the --output folder {out}: {exc.strerror}", hint=HINT) from exc
    if foreign:
        shown = ", ".join(foreign[:4]) + (" ..." if len(foreign) > 4 else "")
        raise OutputUnusable(f"--output {out} holds files `mbuild bench` did not write ({shown})", hint=HINT)
    return entries


def claim_output(out: Path) -> Output:
    """out made the sweep's: an earlier bench's entries there removed, every other option already checked."""
    for entry in _owned(out):
        shutil.rmtree(entry) if entry.name in FOLDERS else entry.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        return Output(out)
    except OSError as exc:
        reason = "it is read-only or you may not write there" if exc.errno in {errno.EACCES, errno.EPERM,
                                                                                 errno.EROFS} else exc.strerror
        raise OutputUnusable(f"cannot write the --output folder {out}: {reason}",
                             hint="give --output a folder you can write, e.g. -o ./bench-out") from exc
