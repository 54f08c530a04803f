"""Digests named by manifests, indexes and references: canonical sha256, checked against their bytes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from builder.errors import UnsafeInput
from builder.hashing import sha256_file

DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


def checked(digest: object, where: str) -> str:
    """The digest if it is canonical sha256 (it becomes a file name and a URL part), else UnsafeInput."""
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise UnsafeInput(f"{where}: {digest!r} is not a sha256 digest (sha256: and 64 lowercase hex digits)")
    return digest


def of_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify_bytes(data: bytes, digest: str, where: str) -> bytes:
    if of_bytes(data) != digest:
        raise UnsafeInput(f"{where}: content does not match its digest {digest}",
                          hint="the image was altered or damaged; fetch or save it again")
    return data


def verify_file(path: Path, digest: str, where: str) -> Path:
    if "sha256:" + sha256_file(path) != digest:
        raise UnsafeInput(f"{where}: {path.name} does not match its digest {digest}",
                          hint="the image was altered or damaged; fetch or save it again")
    return path
