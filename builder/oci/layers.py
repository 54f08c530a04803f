"""Deterministic layers: the same files give the same bytes, so the same digest, on every build.

Entries are sorted, owned by root, stamped with one mtime (SOURCE_DATE_EPOCH), and gzip carries
no name or time. Layer content follows Dockerfile COPY: a source folder's contents land in dest,
source files land inside a dest ending with '/'.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO


@dataclass(frozen=True)
class Copy:
    """One layer: these build-context paths copied to dest (a folder ends with '/')."""

    sources: tuple[str, ...]
    dest: str


@dataclass(frozen=True)
class LayerBlob:
    path: Path  # the gzipped tar
    digest: str  # of the compressed bytes: what manifests and registries name
    diff_id: str  # of the uncompressed tar: what the config's rootfs lists
    size: int


class Hashing(io.RawIOBase):
    """Counts and hashes what passes through on its way to `sink`."""

    def __init__(self, sink: BinaryIO | None) -> None:
        self.sink, self.sha, self.count = sink, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # tarfile asks where it is
        return self.count

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.count += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return len(data)


def _entries(context: Path, copy: Copy) -> list[tuple[str, Path]]:
    """(path inside the image, source path) for every file, folder and link the COPY brings in."""
    dest = PurePosixPath(copy.dest)
    found: list[tuple[str, Path]] = []
    for source in copy.sources:
        src = context / source
        if src.is_dir() and not src.is_symlink():
            found += [(str(dest / p.relative_to(src).as_posix()), p) for p in src.rglob("*")]
        else:
            target = dest / src.name if copy.dest.endswith("/") else dest
            found.append((str(target), src))
    # Parent folders, as COPY creates them.
    parents = {str(parent) for image_path, _ in found for parent in PurePosixPath(image_path).parents}
    parents |= {str(dest)} if copy.dest.endswith("/") or any((context / s).is_dir() for s in copy.sources) else set()
    folders = [(p, Path()) for p in parents if p not in {"/", "."} and p not in {f for f, _ in found}]
    return sorted(found + folders)


def _info(name: str, source: Path, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
    if source == Path() or (source.is_dir() and not source.is_symlink()):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif source.is_symlink():
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(source), 0o777
    else:
        executable = source.stat().st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        info.type, info.size, info.mode = tarfile.REGTYPE, source.stat().st_size, 0o755 if executable else 0o644
    return info


def write_layer(out: Path, fill: Callable[[tarfile.TarFile], None]) -> LayerBlob:
    """A gzipped tar layer at out, its entries added by fill; gzip with no name or time, so equal entries give
    equal bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as raw:
        compressed = Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=6) as gz:
            uncompressed = Hashing(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=uncompressed, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                fill(tar)
    return LayerBlob(out, "sha256:" + compressed.sha.hexdigest(), "sha256:" + uncompressed.sha.hexdigest(),
                     compressed.count)


def build_layer(context: Path, copy: Copy, out: Path, mtime: int) -> LayerBlob:
    def fill(tar: tarfile.TarFile) -> None:
        for name, source in _entries(context, copy):
            info = _info(name, source, mtime)
            if info.type == tarfile.REGTYPE:
                with source.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)

    return write_layer(out, fill)
