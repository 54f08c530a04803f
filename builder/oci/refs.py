"""Image references: [registry[:port]/]name[:tag][@digest], as docker reads them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from builder.errors import InputError

DOCKER_HUB = "registry-1.docker.io"
_NAME = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


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
    if not _NAME.match(path) or (tag and not _TAG.match(tag)) or (digest and not digest.startswith("sha256:")):
        raise InputError(f"{text!r} is not a valid image reference", hint="e.g. registry.example.com:5000/team/app:1.0")
    return ImageRef(registry, path, tag if tag or digest else "latest", digest)
