"""`mbuild base`: a Python base image made from a Debian (or Ubuntu) package mirror, with no container registry.

mmdebstrap (or debootstrap) installs a minimal system with python3 from the mirror an air-gapped site already
keeps; the root filesystem becomes one deterministic layer (sorted entries, numeric owners, modes as
installed, mtimes clamped to SOURCE_DATE_EPOCH, no bytecode caches, gzip without a name or time) in an OCI
layout under the cache, which `--base-image oci:DIR:TAG` reads. The same mirror state and epoch give the same
digest. Made once per (suite, mirror, packages, epoch) and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from builder.errors import BaseImageError, InputError, ToolMissing
from builder.image.spec import source_date_epoch, timestamp
from builder.oci.layers import LayerBlob, write_layer
from builder.oci.layout import Layout, canonical
from builder.oci.media import OCI_CONFIG, OCI_LAYER, OCI_MANIFEST
from builder.resources import mbuild_cache_dir

DEFAULT_SUITE = "bookworm"  # Debian 12: Python 3.11, the runtime's own version
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "ca-certificates")
FORMAT = 1  # bump when the layer's contents change for the same inputs
# Never needed in a serving image; apt's lists and caches also differ from run to run.
PRUNED = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/cache/ldconfig", "var/log",
          "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "tmp", "run")
TRUNCATED = ("etc/machine-id",)  # systemd's id is made per install; an empty file keeps the image's bytes equal


# What a release and a package are called (Debian policy 5.6.1/5.6.7), plus apt's :ARCH and =VERSION: anything
# else would reach mmdebstrap as an option, a path under the cache (the suite names the folder) or a second
# --include list (a comma).
_SUITE = re.compile(r"[a-z0-9][a-z0-9.+_-]{0,63}")
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?")


def check_mirror(mirror: str) -> None:
    """An http(s) URL with a host, as apt fetches from: mmdebstrap also reads a folder, a file:// or a sources
    line as the mirror, and fails late, with only its exit code, on anything else."""
    def refuse(why: str) -> InputError:
        return InputError(f"--mirror {mirror!r} {why}", hint="give the mirror as http://HOST/PATH or "
                                                               f"https://HOST/PATH, e.g. {DEFAULT_MIRROR}")

    if any(c.isspace() or not c.isprintable() for c in mirror):
        raise refuse("holds whitespace or control characters")
    parts = urlsplit(mirror)
    if parts.scheme not in ("http", "https"):
        raise refuse("is not an http or https URL")
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise refuse("has a port that is not a number in 1-65535")
    if not parts.hostname:
        raise refuse("names no host")


def check_inputs(suite: str, mirror: str, packages: tuple[str, ...]) -> None:
    """Everything `mbuild base` hands to the bootstrap tool, refused up front with the option to fix."""
    if not _SUITE.fullmatch(suite):
        raise InputError(f"--suite {suite!r} is not a release name", hint="give one such as bookworm or noble")
    check_mirror(mirror)
    for package in packages:
        if not _PACKAGE.fullmatch(package):
            raise InputError(f"--package {package!r} is not a Debian package name",
                             hint="give one name per --package, e.g. --package libgomp1 (NAME[:ARCH][=VERSION])")


@dataclass(frozen=True)
class BaseResult:
    reference: str  # oci:DIR:TAG, what --base-image takes
    digest: str  # the manifest's
    reused: bool


def bootstrap_tool() -> str | None:
    """What `mbuild base` would run here, or None when it cannot."""
    if shutil.which("mmdebstrap"):
        return "mmdebstrap"
    return "debootstrap (as root)" if shutil.which("debootstrap") and os.geteuid() == 0 else None


def _tool() -> list[str]:
    if shutil.which("mmdebstrap"):
        return ["mmdebstrap", "--variant=minbase", "--mode=auto"]
    if shutil.which("debootstrap"):
        if os.geteuid() != 0:
            raise ToolMissing("debootstrap needs root to make a base image",
                              hint="run `mbuild base` as root, or install mmdebstrap (it runs unprivileged)")
        return ["debootstrap", "--variant=minbase"]
    raise ToolMissing("neither mmdebstrap nor debootstrap is installed",
                      hint="apt-get install mmdebstrap (or debootstrap), or give --base-image oci:DIR:TAG")


def make_rootfs(suite: str, mirror: str, packages: tuple[str, ...], root: Path, log: Path) -> None:
    command = [*_tool(), f"--include={','.join(packages)}", suite, str(root), mirror]
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
        raise BaseImageError(f"{command[0]} {suite} from {mirror} failed (exit {code}):\n{tail}",
                             hint=f"check that the mirror answers and carries {suite}; full log: {log}")


def prune(root: Path) -> None:
    for name in PRUNED:
        folder = root / name
        if folder.is_dir() and not folder.is_symlink():
            for child in folder.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    for name in TRUNCATED:
        if (root / name).is_file():
            (root / name).write_bytes(b"")
    for cache in sorted(root.rglob("__pycache__"), reverse=True):  # bytecode is not byte-for-byte reproducible
        if cache.is_dir() and not cache.is_symlink():
            shutil.rmtree(cache)
    root.chmod(0o755)


def rootfs_layer(root: Path, out: Path, epoch: int) -> LayerBlob:
    """The whole tree as one layer, byte-identical for identical trees. Device nodes, sockets and fifos are left
    out: container engines make /dev themselves."""
    def fill(tar: tarfile.TarFile) -> None:
        for path in sorted(root.rglob("*")):
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                continue
            info = tar.gettarinfo(str(path), path.relative_to(root).as_posix())  # hard links found here
            info.mtime = min(int(info.mtime), epoch)
            info.uname = info.gname = ""
            info.pax_headers = {}
            if info.isreg():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)

    return write_layer(out, fill)


def write_layout(root: Path, layout_dir: Path, tag: str, epoch: int, made_by: str) -> str:
    """The OCI layout of one rootfs layer; returns the manifest's digest."""
    layout = Layout(layout_dir)
    work = layout_dir / "layer.tmp"
    layout_dir.mkdir(parents=True, exist_ok=True)
    blob = rootfs_layer(root, work, epoch)
    layer = layout.put_file(work, blob.digest, OCI_LAYER)
    work.unlink()
    created = timestamp(epoch)
    config = {"created": created, "architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
                         "Cmd": ["python3"]},
              "rootfs": {"type": "layers", "diff_ids": [blob.diff_id]},
              "history": [{"created": created, "created_by": made_by}]}
    config_desc = layout.put_bytes(canonical(config), OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc.to_dict(),
                "layers": [layer.to_dict()]}
    manifest_desc = layout.put_bytes(canonical(manifest), OCI_MANIFEST)
    layout.write_index(manifest_desc, tag)
    return manifest_desc.digest


def make_base(suite: str = DEFAULT_SUITE, mirror: str = DEFAULT_MIRROR, packages: tuple[str, ...] = PACKAGES,
              force: bool = False) -> BaseResult:
    check_inputs(suite, mirror, packages)
    epoch = source_date_epoch()
    inputs = json.dumps({"suite": suite, "mirror": mirror, "packages": sorted(packages), "epoch": epoch,
                         "format": FORMAT}, sort_keys=True)
    folder = mbuild_cache_dir() / "bases" / f"debian-{suite}-{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"
    tag = f"{suite}-python3"
    reference = f"oci:{folder}:{tag}"
    if (folder / "index.json").is_file() and not force:
        return BaseResult(reference, Layout(folder).manifest(tag)[0].digest, reused=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    root = folder.with_name(folder.name + ".rootfs")
    shutil.rmtree(root, ignore_errors=True)
    try:
        make_rootfs(suite, mirror, packages, root, folder.with_name(folder.name + ".log"))
        prune(root)
        digest = write_layout(root, folder, tag, epoch, f"mbuild base: {suite} {' '.join(packages)} from {mirror}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BaseResult(reference, digest, reused=False)
