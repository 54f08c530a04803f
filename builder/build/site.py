"""The runtime's Python packages, installed on the build host for the image's platform and Python.

pip downloads the wheels once into a cache keyed by the requirement set, then installs them with
`--target` into a folder the image copies as one layer. No RUN step, no pip and no network inside
the image build: TLS-intercepting proxies and air gaps stop nothing, and every backend (docker,
podman, buildah, the daemonless OCI writer) gets the same files.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from email.parser import HeaderParser
from pathlib import Path

from builder.errors import ToolMissing
from builder.resources import mbuild_cache_dir

_GLIBC_MINOR_MAX = 36  # Debian bookworm, the default base's libc


def platform_tags(machine: str | None = None) -> list[str]:
    arch = machine or platform.machine() or "x86_64"
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(_GLIBC_MINOR_MAX, 16, -1)]
    return [*tags, f"manylinux2014_{arch}"]


def _pip(args: list[str], python_version: str, what: str, hint: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--quiet", "--only-binary=:all:",
               "--implementation", "cp", "--python-version", python_version]
    for tag in platform_tags():
        command += ["--platform", tag]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(line for line in result.stderr.strip().splitlines() if "is ignored" not in line)[-1500:]
        raise ToolMissing(f"pip could not {what} for Python {python_version}:\n{tail}", hint=hint)


def _key(requirements: list[str], python_version: str, no_deps: list[str]) -> str:
    lines = [python_version, *platform_tags(), *requirements, *(["--no-deps", *no_deps] if no_deps else [])]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _copy_tree(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    try:
        shutil.copytree(src, dest, copy_function=os.link)  # same filesystem: no copy
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)


def install_site(requirements: list[str], python_version: str, dest: Path, no_deps: list[str] | None = None) -> Path:
    """Fill dest with the installed packages (cached per requirement set) and return it. no_deps: lines installed
    after the others, again and without their dependencies (builder/versions.EXTRAS says why)."""
    no_deps = no_deps or []
    key = _key(requirements, python_version, no_deps)
    wheels = mbuild_cache_dir() / "wheels" / key
    site = mbuild_cache_dir() / "site" / key
    hint = (f"check access to your package index (PIP_INDEX_URL, PIP_CERT), or put the wheels for "
            f"{' '.join(requirements)} (Python {python_version}, manylinux) into {wheels} and create "
            f"{wheels / '.complete'}")
    if not (wheels / ".complete").is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        _pip(["download", "--dest", str(wheels), *requirements], python_version, "download the runtime's wheels",
             hint)
        if no_deps:
            _pip(["download", "--no-deps", "--dest", str(wheels), *no_deps], python_version,
                 "download the runtime's wheels", hint)
        (wheels / ".complete").write_text("\n".join(requirements) + "\n")
    if not (site / ".complete").is_file():
        staging = site.with_name(key + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        _pip(["install", "--target", str(staging), "--no-index", "--find-links", str(wheels), "--no-compile",
              *requirements], python_version, "install the runtime's packages", hint)
        if no_deps:  # --upgrade: pip replaces the folders these share with what it installed above
            _pip(["install", "--target", str(staging), "--no-index", "--find-links", str(wheels), "--no-compile",
                  "--no-deps", "--upgrade", *no_deps], python_version, "install the runtime's packages", hint)
        shutil.rmtree(staging / "bin", ignore_errors=True)  # console scripts would point at this host's Python
        shutil.rmtree(site, ignore_errors=True)
        staging.rename(site)
        (site / ".complete").write_text("\n".join(requirements) + "\n")
    _copy_tree(site, dest)
    (dest / ".complete").unlink()
    return dest


def installed_packages(site: Path) -> list[dict[str, str]]:
    """Name and version of every distribution in an installed site folder (the image's pip freeze)."""
    found = []
    for metadata in sorted(site.glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(metadata.read_text(errors="replace"))
        found.append({"name": headers.get("Name", metadata.parent.name), "version": headers.get("Version", "")})
    return sorted(found, key=lambda p: p["name"].lower())
