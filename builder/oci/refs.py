"""Image references, parsed in one place for every command that takes one.

    oci:DIR[:TAG]              an OCI image layout folder (TAG may hold '/' and ':', as mbuild's tags do)
    oci-archive:FILE[:TAG]     the same, as a tar
    docker-archive:FILE        what `docker save` writes
    DIR                        a folder (a build directory, for push and inspect)
    [registry[:port]/]name[:tag][@digest]   as docker reads them
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from builder.errors import InputError
from builder.oci.digests import DIGEST

DOCKER_HUB = "registry-1.docker.io"
_NAME = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REGISTRY = re.compile(r"([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(:[0-9]+)?")  # host[:port]

SourceKind = Literal["oci", "oci-archive", "docker-archive", "dir", "name"]
TRANSPORTS: tuple[SourceKind, ...] = ("oci-archive", "oci", "docker-archive")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]
    name: str  # repository path inside the registry
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What the manifest endpoint takes: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.name}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_ref(text: str) -> ImageRef:
    rest = text.removeprefix("docker://")
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, remainder
    else:
        registry, path = DOCKER_HUB, rest
    tag = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, tag = path.rsplit(":", 1)
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    # fullmatch: `$` also matches before a final newline, which would reach a manifest's image field.
    if (not _REGISTRY.fullmatch(registry) or not _NAME.fullmatch(path) or (tag and not _TAG.fullmatch(tag))
            or (digest and not DIGEST.fullmatch(digest))):
        raise InputError(f"{text!r} is not a valid image reference",
                         hint="e.g. registry.example.com:5000/team/app:1.0 or name@sha256:<64 hex digits>")
    return ImageRef(registry, path, tag if tag or digest else "latest", digest)


@dataclass(frozen=True)
class ImageSource:
    """Where an image is: a local layout or archive (path, tag), a folder, or a name for a registry or engine."""

    text: str
    kind: SourceKind
    path: Path = Path()
    tag: str | None = None


def _path_and_tag(body: str, kind: SourceKind) -> tuple[Path, str | None]:
    """Split PATH[:TAG]: the longest existing path wins, else skopeo's rule (the first ':')."""
    wanted = Path.is_dir if kind == "oci" else Path.is_file
    if wanted(Path(body)) or kind == "docker-archive":
        return Path(body), None
    cuts = [i for i, char in enumerate(body) if char == ":"]
    for cut in reversed(cuts):
        if wanted(Path(body[:cut])):
            return Path(body[:cut]), body[cut + 1:] or None
    path, _, tag = body.partition(":")
    return Path(path), tag or None


def parse_image_source(text: str) -> ImageSource:
    for kind in TRANSPORTS:
        if text.startswith(f"{kind}:"):
            body = text.removeprefix(f"{kind}:")
            if not body:
                raise InputError(f"{text!r} names no path", hint=f"write {kind}:PATH")
            path, tag = _path_and_tag(body, kind)
            return ImageSource(text, kind, path, tag)
    if text.startswith(("/", "./", "../", "~")) or Path(text).is_dir():
        return ImageSource(text, "dir", Path(text).expanduser())
    parse_ref(text)  # a malformed name is an error here, not deep in a push
    return ImageSource(text, "name")
