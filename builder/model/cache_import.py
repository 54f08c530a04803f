"""`mbuild cache import`: put a model folder into the standard Hugging Face cache layout.

The air-gapped workflow: copy a model folder to a host without Hub access, import it, and the
same snapshot_download(..., local_files_only=True) that online builds use finds it.
Layout written: models--org--name/{blobs/<id>, snapshots/<sha>/<file> -> ../../blobs/<id>, refs/<rev>}.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError, UnsafeInput
from builder.hashing import git_blob_sha1, sha256_file
from builder.model.hubcache import repo_folder
from builder.model.sources import COMMIT_SHA, REPO_ID
from builder.safepaths import stays_inside

# The Hub stores large and binary files in LFS, named by sha256; small text files by git blob sha1.
_LFS_MIN_BYTES = 10 * 1024 * 1024
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".h5", ".msgpack", ".model", ".gguf")


@dataclass(frozen=True)
class ImportResult:
    repo: str
    sha: str
    snapshot: Path
    files: int
    bytes: int


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
_REPLACE = "replace it with the regular file it stands for (copy its bytes in), or remove it from the folder"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _link_target(src: Path, path: Path, rel: str) -> Path:
    """Where a link in the folder leads, once it is known to lead to a regular file inside the folder."""
    try:
        target = path.resolve()
        mode = target.stat().st_mode
    except (RuntimeError, OSError) as exc:  # 3.11's resolve raises RuntimeError on a loop
        missing = isinstance(exc, FileNotFoundError)
        raise InputError(f"{rel} in {src} is a link to {os.readlink(path)}, which "
                         + ("does not exist" if missing else "leads back to itself (a loop)"),
                         hint=_REPLACE) from exc
    # A link may point within the folder (a local_dir download's own links); one that leaves it would copy
    # a file the user never meant to import (a key, /etc/shadow, /dev/zero) into a cache others read.
    if not stays_inside(src, path):
        what = "a file" if stat.S_ISREG(mode) else _kind(mode)
        raise UnsafeInput(f"{rel} in {src} is a link to {target} ({what}), outside {src}; refusing to import it",
                          hint="copy the real file into the folder, or remove the link")
    if stat.S_ISDIR(mode):
        raise InputError(f"{rel} in {src} is a link to a folder ({target}); its files are not imported through it",
                         hint="replace the link with a copy of the folder, or remove it")
    return target


def _source_files(src: Path) -> list[Path]:
    """Every regular file of the folder, links inside it followed. Anything else is refused by name, never left
    out: a tokenizer.json that is a FIFO or weights that are a device would make an image without them (and
    reading either may never end)."""
    files = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        # Dot-folders (.git, .cache/huggingface from local_dir downloads) are not model content.
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        mode = _link_target(src, path, rel).stat().st_mode if path.is_symlink() else path.lstat().st_mode
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            raise InputError(f"{rel} in {src} is {_kind(mode)}, not a regular file, so it cannot be imported",
                             hint=_REPLACE)
        files.append(path)
    return files


def _blob_id(path: Path) -> str:
    if path.suffix in _LFS_SUFFIXES or path.stat().st_size >= _LFS_MIN_BYTES:
        return sha256_file(path)
    return git_blob_sha1(path)


def derived_commit(entries: list[tuple[str, str]]) -> str:
    """A stable 40-hex id for a folder's content, used when the user gives no --revision."""
    digest = hashlib.sha1()
    for rel, blob in entries:
        digest.update(f"{rel}\0{blob}\n".encode())
    return digest.hexdigest()


def import_folder(src: Path, repo: str, revision: str | None = None, ref: str = "main") -> ImportResult:
    if not REPO_ID.match(repo):
        raise InputError(f"--repo {repo!r} is not of the form org/name")
    if revision is not None and not COMMIT_SHA.match(revision):
        raise InputError(f"--revision {revision!r} is not a 40-character commit sha",
                         hint="give the commit the folder was downloaded at, or leave --revision out")
    if not src.is_dir():
        raise InputError(f"no such folder: {src}")
    files = _source_files(src)
    if not any(p.name == "config.json" and p.parent == src for p in files):
        raise InputError(f"{src} holds no config.json at its top level; is it a model folder?")

    entries = [(p.relative_to(src).as_posix(), _blob_id(p)) for p in files]
    sha = revision or derived_commit(entries)
    folder = repo_folder(repo)
    snapshot = folder / "snapshots" / sha
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    total = 0
    for path, (rel, blob) in zip(files, entries, strict=True):
        blob_path = folder / "blobs" / blob
        if not blob_path.exists():
            tmp = blob_path.with_name(blob + ".incomplete")
            shutil.copy(path, tmp)  # with its mode: a private file stays private in the cache
            os.replace(tmp, blob_path)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob_path, link.parent))
        total += path.stat().st_size
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / ref).write_text(sha)
    return ImportResult(repo=repo, sha=sha, snapshot=snapshot, files=len(files), bytes=total)
