"""Where templates/ and profiles/ live: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from builder.settings import child_env, host_settings

_HERE = Path(__file__).resolve().parent


def resource_dir(name: Literal["templates", "profiles"]) -> Path:
    packaged = _HERE / "_resources" / name  # placed there by the wheel build (pyproject force-include)
    if packaged.is_dir():
        return packaged
    return _HERE.parent / name


def runtimes_dir() -> Path:
    """The runtime package's source folder, copied into every image (never imported here)."""
    return _HERE.parent / "runtimes"


def runtime_env(model_dir: Path, **changes: str) -> dict[str, str]:
    """The environment a runtime started on this host gets (`mbuild serve`, `mbuild bench`): the settings it passes
    on, its model folder, and this checkout's runtimes/ first on the import path."""
    env = child_env(MBUILD_MODEL_DIR=str(model_dir.resolve()), **changes)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(runtimes_dir().parent), env.get("PYTHONPATH")]))
    return env


def mbuild_cache_dir() -> Path:
    """mbuild's own cache (wheels, installed packages, base images, layers): MBUILD_CACHE or ~/.cache/mbuild."""
    return host_settings().cache_dir
