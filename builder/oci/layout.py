"""An OCI image layout on disk: blobs/sha256/<hex>, index.json, oci-layout.

Reading takes any manifest (OCI or Docker v2s2 media types); writing stores blobs by content so
two identical builds produce identical layouts.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import InputError, UnsafeInput
from builder.oci.digests import checked, of_bytes, verify_bytes, verify_file
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
    def from_dict(cls, raw: Any, where: str = "descriptor") -> Descriptor:
        try:
            media, digest, size = str(raw["mediaType"]), raw["digest"], int(raw["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UnsafeInput(f"{where}: not an OCI descriptor (mediaType, digest, size): {str(raw)[:200]}") from exc
        return cls(media, checked(digest, where), size)


def canonical(data: dict[str, Any]) -> bytes:
    """The bytes we store for JSON documents: stable key order, no whitespace."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _tag(entry: dict[str, Any]) -> str | None:
    annotations = entry.get("annotations")
    return annotations.get(REF_NAME) if isinstance(annotations, dict) else None


def is_linux_amd64(entry: object, strict: bool = True) -> bool:
    """An index entry for linux/amd64; strict=False also takes entries that name no platform."""
    if not isinstance(entry, dict):
        return False
    found = entry.get("platform")
    platform: dict[str, Any] = found if isinstance(found, dict) else {}
    default = None if strict else "linux"
    return (platform.get("architecture") in ({"amd64"} if strict else {"amd64", None})
            and platform.get("os", default) == "linux")


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexdigest = checked(digest, f"{self.root}").partition(":")
        return self.root / "blobs" / algorithm / hexdigest

    def verified_blob(self, digest: str) -> Path:
        """The blob's file once its bytes hash to its name; a link is not followed out of the layout."""
        path = self.blob_path(digest)
        if path.is_symlink() or not path.is_file():
            raise UnsafeInput(f"{self.root}: blob {digest} is missing or not a plain file",
                              hint="copy the layout again (skopeo copy ... oci:DIR:TAG)")
        return verify_file(path, digest, f"{self.root}")

    def has(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def put_bytes(self, data: bytes, media_type: str) -> Descriptor:
        digest = of_bytes(data)
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
        blob = self.verified_blob(digest)
        try:
            data = json.loads(verify_bytes(blob.read_bytes(), digest, f"{self.root}"))
        except ValueError as exc:
            raise UnsafeInput(f"{self.root}: blob {digest} is not JSON") from exc
        if not isinstance(data, dict):
            raise UnsafeInput(f"{self.root}: blob {digest} is not a JSON object")
        return data

    def index(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.root} is not an OCI image layout (no readable index.json)",
                             hint="make one with `skopeo copy docker://IMAGE oci:DIR:TAG`") from exc
        if not isinstance(data, dict) or not isinstance(data.get("manifests", []), list):
            raise UnsafeInput(f"{self.root}/index.json is not an OCI index")
        return data

    def manifest(self, tag: str | None = None) -> tuple[Descriptor, dict[str, Any]]:
        """The manifest named tag (or the only one), following one level of image index."""
        listed = [m for m in self.index().get("manifests", []) if isinstance(m, dict)]
        entries = [m for m in listed if tag is None or _tag(m) == tag]
        if len(entries) != 1:
            names = [_tag(m) for m in listed]
            raise InputError(f"{self.root}: cannot pick a manifest for tag {tag!r} (tags here: {names})",
                             hint="name one of the tags: oci:DIR:TAG")
        desc = Descriptor.from_dict(entries[0], f"{self.root}/index.json")
        data = self.read_json(desc.digest)
        if desc.media_type in INDEXES or data.get("mediaType") in INDEXES:
            chosen = next((m for m in data.get("manifests") or [] if is_linux_amd64(m, strict=False)), None)
            if chosen is None:
                raise InputError(f"{self.root}: the index has no linux/amd64 image")
            desc = Descriptor.from_dict(chosen, f"{self.root}: image index")
            data = self.read_json(desc.digest)
        if not isinstance(data.get("config"), dict) or not isinstance(data.get("layers"), list):
            raise UnsafeInput(f"{self.root}: manifest {desc.digest} has no config and layers")
        return desc, data

    def write_index(self, manifest: Descriptor, tag: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        entry = {**manifest.to_dict(), "annotations": {REF_NAME: tag}}
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
        (self.root / "index.json").write_bytes(canonical(index))
