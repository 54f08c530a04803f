"""An OCI image layout on disk: blobs/sha256/<hex>, index.json, oci-layout.

Reading takes any manifest (OCI or Docker v2s2 media types); writing stores blobs by content so
two identical builds produce identical layouts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import InputError
from builder.oci.media import INDEXES, OCI_INDEX

REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Descriptor:
        return cls(raw["mediaType"], raw["digest"], int(raw["size"]))


def canonical(data: dict[str, Any]) -> bytes:
    """The bytes we store for JSON documents: stable key order, no whitespace."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        return self.root / "blobs" / algorithm / hexdigest

    def has(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def put_bytes(self, data: bytes, media_type: str) -> Descriptor:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.blob_path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return Descriptor(media_type, digest, len(data))

    def put_file(self, source: Path, digest: str, media_type: str) -> Descriptor:
        path = self.blob_path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            shutil.copyfile(source, tmp)
            os.replace(tmp, path)
        return Descriptor(media_type, digest, path.stat().st_size)

    def read_json(self, digest: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.blob_path(digest).read_bytes())
        return data

    def index(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.root} is not an OCI image layout (no readable index.json)") from exc
        return data

    def manifest(self, tag: str | None = None) -> tuple[Descriptor, dict[str, Any]]:
        """The manifest named tag (or the only one), following one level of image index."""
        entries = self.index().get("manifests", [])
        if tag is not None:
            entries = [m for m in entries if m.get("annotations", {}).get(REF_NAME) == tag]
        if len(entries) != 1:
            names = [m.get("annotations", {}).get(REF_NAME) for m in self.index().get("manifests", [])]
            raise InputError(f"{self.root}: cannot pick a manifest for tag {tag!r} (tags here: {names})")
        desc = Descriptor.from_dict(entries[0])
        data = self.read_json(desc.digest)
        if desc.media_type in INDEXES or data.get("mediaType") in INDEXES:
            chosen = next((m for m in data["manifests"] if m.get("platform", {}).get("architecture") in
                           {"amd64", None} and m.get("platform", {}).get("os", "linux") == "linux"), None)
            if chosen is None:
                raise InputError(f"{self.root}: the index has no linux/amd64 image")
            desc = Descriptor.from_dict(chosen)
            data = self.read_json(desc.digest)
        return desc, data

    def write_index(self, manifest: Descriptor, tag: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        entry = {**manifest.to_dict(), "annotations": {REF_NAME: tag}}
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
        (self.root / "index.json").write_bytes(canonical(index))
