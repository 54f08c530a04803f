"""The interface every image backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class ImageResult:
    tag: str
    image_id: str  # sha256:... of the image config, as the backend reports it
    size_bytes: int | None
    backend: str
    reused: bool = False


class ImageBackend(Protocol):
    name: str

    def available(self) -> bool:
        """True when this backend can build here (its tool and daemon answer)."""
        ...

    def why_unavailable(self) -> str: ...

    def existing(self, tag: str) -> ImageResult | None:
        """The image already built under tag, if any."""
        ...

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult: ...
