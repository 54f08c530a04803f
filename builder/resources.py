"""Where templates/ and profiles/ live: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from builder.settings import host_settings

_HERE = Path(__file__).resolve().parent


def resource_dir(name: Literal["templates", "profiles"]) -> Path:
    packaged = _HERE / "_resources" / name  # placed there by the wheel build (pyproject force-include)
    if packaged.is_dir():
        return packaged
    return _HERE.parent / name


def runtimes_dir() -> Path:
    """The runtime package's source folder, copied into every image (never imported here)."""
    return _HERE.parent / "runtimes"


def mbuild_cache_dir() -> Path:
    """mbuild's own cache (wheels, installed packages, base images, layers): MBUILD_CACHE or ~/.cache/mbuild."""
    return host_settings().cache_dir
