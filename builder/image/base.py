"""The interface every image backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from builder.errors import ImageBuildError


@dataclass(frozen=True)
class ImageResult:
    tag: str
    image_id: str  # sha256 of the image config, as the backend reports it
    size_bytes: int | None
    backend: str
    reused: bool = False
    digest: str | None = None  # the manifest's digest, where the backend has one before any push
    layers: tuple[tuple[str, int], ...] = ()  # (what made it, bytes) from base to top, where known


class ImageBackend(Protocol):
    name: str

    def unavailable(self) -> ImageBuildError | None:
        """None when this backend can build here, else the error that says why and what to do."""
        ...

    def check_base(self, base_image: str, python: str | None) -> None:
        """BaseImageError now, before any download or export, when the build could not get or use its base."""
        ...

    def existing(self, tag: str, context: Path) -> ImageResult | None:
        """The image already built under tag from this context, if any."""
        ...

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult: ...
