"""Fetch the runtime's wheels on the build host, for the image's platform and Python.

The image build then installs with --no-index: no network inside the build (TLS-intercepting
proxies and air gaps stop nothing), and a cache keyed by the requirement set makes rebuilds fast.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from builder.errors import ToolMissing

_GLIBC_MINOR_MAX = 36  # Debian bookworm, the default base's libc


def mbuild_cache_dir() -> Path:
    root = os.environ.get("MBUILD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "mbuild")
    return Path(root)


def platform_tags(machine: str | None = None) -> list[str]:
    arch = machine or platform.machine() or "x86_64"
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(_GLIBC_MINOR_MAX, 16, -1)]
    return [*tags, f"manylinux2014_{arch}"]


def fetch_wheels(requirements: list[str], python_version: str, dest: Path) -> list[Path]:
    """Copy the wheels for `requirements` into dest, downloading into the shared cache when needed."""
    key = hashlib.sha256("\n".join([python_version, *platform_tags(), *requirements]).encode()).hexdigest()[:16]
    cache = mbuild_cache_dir() / "wheels" / key
    done = cache / ".complete"
    if not done.is_file():
        _download(requirements, python_version, cache, done)
        done.write_text("\n".join(requirements) + "\n")
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for wheel in sorted(cache.glob("*.whl")):
        target = dest / wheel.name
        if not target.exists():
            try:
                os.link(wheel, target)  # same filesystem: no copy
            except OSError:
                shutil.copy2(wheel, target)
        copied.append(target)
    return copied


def _download(requirements: list[str], python_version: str, cache: Path, done: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
               "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
               "--dest", str(cache)]
    for tag in platform_tags():
        command += ["--platform", tag]
    result = subprocess.run([*command, *requirements], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        raise ToolMissing(
            f"pip could not download the runtime's wheels for Python {python_version}:\n{tail}",
            hint=f"check access to your package index (PIP_INDEX_URL, PIP_CERT), or put the wheels for "
                 f"{' '.join(requirements)} (Python {python_version}, manylinux) into {cache} and create {done}",
        )
