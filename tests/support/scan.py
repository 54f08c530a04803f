"""Look for a string anywhere in an image: every file of every layer, configs, manifests, history."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path


def _payloads(data: bytes, depth: int = 0) -> list[bytes]:
    """The bytes themselves, plus every member of the tar (or gzip of a tar) they are, recursively."""
    found = [data]
    if depth > 3:
        return found
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
            found.append(data)
        except OSError:
            return found
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                found.append(member.name.encode() + member.linkname.encode())
                if member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found += _payloads(handle.read(), depth + 1)
    except tarfile.TarError:
        pass
    return found


def occurrences(path: Path, needle: str) -> list[str]:
    """Where needle occurs in a file (an image archive or a blob), by payload index."""
    target = needle.encode()
    return [f"{path.name}#{i}" for i, payload in enumerate(_payloads(path.read_bytes())) if target in payload]


def scan_tree(root: Path, needle: str) -> list[str]:
    hits: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        hits += occurrences(path, needle)
    return hits
