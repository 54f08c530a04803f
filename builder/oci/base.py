"""Base images for the daemonless OCI writer: from a registry, a local OCI layout, or a tar.

    oci:PATH[:TAG]             an OCI image layout folder (skopeo copy ... oci:PATH:TAG makes one)
    oci-archive:PATH[:TAG]     the same, as a tar
    docker-archive:PATH        what `docker save` writes
    [registry/]name[:tag]      pulled with the distribution API into ~/.cache/mbuild/bases

Nothing a base names is trusted: archive entries stay inside the archive, digests are canonical and
every blob is hashed when read, and a digest-pinned reference must match the bytes the registry sends.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import BaseImageError, ImageBuildError, InputError, MbuildError, UnsafeInput
from builder.hashing import sha256_file
from builder.oci.layers import Hashing
from builder.oci.layout import Descriptor, Layout, canonical, is_linux_amd64
from builder.oci.media import GZIP_LAYERS, INDEXES, OCI_CONFIG, OCI_LAYER, OCI_MANIFEST
from builder.oci.refs import ImageRef, ImageSource, parse_image_source, parse_ref
from builder.oci.registry import Registry
from builder.resources import mbuild_cache_dir
from builder.safepaths import inside


@dataclass(frozen=True)
class BaseImage:
    source: str
    config: dict[str, Any]
    layers: tuple[tuple[Descriptor, Path], ...]  # gzip layers with the file that holds each


def _from_layout(source: str, layout: Layout, tag: str | None) -> BaseImage:
    _, manifest = layout.manifest(tag)
    config_desc = Descriptor.from_dict(manifest["config"], f"base {source}: config")
    config = layout.read_json(config_desc.digest)
    layers = []
    for entry in manifest["layers"]:
        desc = Descriptor.from_dict(entry, f"base {source}: layer")
        if desc.media_type not in GZIP_LAYERS:
            raise BaseImageError(f"base {source}: layer type {desc.media_type} is not supported (gzip layers are)")
        layers.append((desc, layout.verified_blob(desc.digest)))
    rootfs = config.get("rootfs")
    if not isinstance(rootfs, dict) or not isinstance(rootfs.get("diff_ids"), list) \
            or len(rootfs["diff_ids"]) != len(layers):
        raise UnsafeInput(f"base {source}: its config's rootfs does not list one diff_id per layer")
    return BaseImage(source, config, tuple(layers))


def _cache(key: str) -> Path:
    return mbuild_cache_dir() / "bases" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _gzip_into(layout: Layout, raw_tar: Path) -> Descriptor:
    tmp = layout.root / "tmp.gz"
    with raw_tar.open("rb") as src, tmp.open("wb") as out:
        hashing = Hashing(out)
        with gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0) as gz:
            shutil.copyfileobj(src, gz)
    desc = layout.put_file(tmp, "sha256:" + hashing.sha.hexdigest(), OCI_LAYER)
    tmp.unlink()
    return desc


def _archive_digest(source: str, archive: Path) -> str:
    if not archive.is_file():
        raise BaseImageError(f"base {source}: no such file {archive}",
                             hint="give the path of a file `docker save` or `skopeo copy ... oci-archive:` wrote")
    return sha256_file(archive)


def _extract(source: str, archive: Path, dest: Path) -> None:
    """Unpack with tarfile's 'data' filter: absolute names, ../ and links out of dest are refused."""
    shutil.rmtree(dest, ignore_errors=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    except tarfile.FilterError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise UnsafeInput(f"base {source}: the archive has an entry that leaves its folder: {exc}",
                          hint="the archive was not written by docker save or skopeo; do not use it") from exc
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise BaseImageError(f"base {source}: cannot read the archive: {exc}") from exc


def _docker_manifest(source: str, work: Path) -> tuple[Path, list[Path]]:
    """manifest.json's config and layer files, each confined to the unpacked archive."""
    try:
        entry = json.loads((work / "manifest.json").read_text())[0]
        config, layers = entry["Config"], entry["Layers"]
    except (OSError, ValueError, LookupError, TypeError) as exc:
        raise BaseImageError(f"base {source}: not a docker save archive (no usable manifest.json)") from exc
    if not isinstance(config, str) or not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
        raise UnsafeInput(f"base {source}: manifest.json names its files with something other than strings")
    where = f"base {source}: manifest.json"
    files = [inside(work, config, where), *(inside(work, name, where) for name in layers)]
    for path in files:
        if not path.is_file():
            raise BaseImageError(f"base {source}: manifest.json names {path.relative_to(work.resolve())}, "
                                 "which the archive does not hold")
    return files[0], files[1:]


def _docker_archive_layout(source: str, archive: Path) -> Layout:
    """`docker save` output: uncompressed layers, converted once into a cached OCI layout."""
    cache = _cache(f"docker-archive:{_archive_digest(source, archive)}")
    layout = Layout(cache)
    if not (cache / "index.json").is_file():
        work = cache.with_name(cache.name + ".unpacked")
        _extract(source, archive, work)
        if (work / "index.json").is_file() and (work / "blobs").is_dir():  # newer docker saves an OCI layout
            shutil.rmtree(cache, ignore_errors=True)
            work.rename(cache)
            return layout
        config, layer_files = _docker_manifest(source, work)
        config_desc = layout.put_bytes(config.read_bytes(), OCI_CONFIG)
        layers = [_gzip_into(layout, path).to_dict() for path in layer_files]
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc.to_dict(), "layers": layers}
        layout.write_index(layout.put_bytes(canonical(manifest), OCI_MANIFEST), "base")
        shutil.rmtree(work, ignore_errors=True)
    return layout


def _oci_archive_layout(source: str, archive: Path) -> Layout:
    cache = _cache(f"oci-archive:{_archive_digest(source, archive)}")
    if not (cache / "index.json").is_file():
        _extract(source, archive, cache)
    return Layout(cache)


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise UnsafeInput(f"{where} is not JSON") from exc
    if not isinstance(value, dict):
        raise UnsafeInput(f"{where} is not a JSON object")
    return value


# What to do when a registry base cannot be had: named in every such error.
NO_REGISTRY_FIXES = ("`mbuild base` makes a python3 base from a Debian mirror (then --base-image oci:DIR:TAG as it "
                     "prints); or --base-image oci:DIR:TAG / docker-archive:FILE of a base copied to this host; or "
                     "--base-image naming a registry mirror this host reaches; or --backend none to stop at the "
                     "build context")


def _pin(source: str) -> Path:
    """Where the digest a registry reference last resolved to is kept, so --offline can use that pull."""
    return _cache(f"pin:{source}").with_suffix(".digest")


def _pinned(source: str) -> BaseImage:
    """The base as last pulled, with no registry contact (--offline)."""
    try:
        digest = _pin(source).read_text().strip()
    except OSError:
        digest = ""
    cached = _cache(f"registry:{digest}")
    if not digest or not (cached / "index.json").is_file():
        raise BaseImageError(f"base image {source} is not on this host, and --offline forbids pulling it from "
                             f"{parse_ref(source).registry}", hint=NO_REGISTRY_FIXES)
    return _from_layout(source, Layout(cached), None)


def registry_base_status(source: str, offline: bool) -> tuple[bool, str]:
    """Can a build get this registry base now? (usable, why), for doctor: a pull kept here, or its registry."""
    try:
        _pinned(source)
        return True, "pulled before (usable offline)"
    except MbuildError:
        pass
    registry = parse_ref(source).registry
    if offline:
        return False, f"not on this host, and offline forbids pulling it from {registry}"
    try:
        with Registry(parse_ref(source), timeout=5) as client:
            client.request("GET", f"{client.base.split('/v2/')[0]}/v2/")
        return True, f"{registry} answers"
    except MbuildError:
        return False, f"not on this host, and {registry} does not answer"


def _from_registry(source: str, offline: bool = False) -> BaseImage:
    if offline:
        return _pinned(source)
    ref = parse_ref(source)
    try:
        return _pull(source, ref)
    except ImageBuildError as exc:
        raise BaseImageError(f"cannot pull the base image {source}: {exc.message}",
                             hint=f"{exc.hint + '; or ' if exc.hint else ''}{NO_REGISTRY_FIXES}") from exc


def platform_manifest(registry: Registry, ref: ImageRef, source: str) -> tuple[bytes, str, str, dict[str, Any]]:
    """The linux/amd64 image's manifest (through an index where there is one): bytes, media type, digest, JSON."""
    # get_manifest checks the bytes against a digest reference: a pinned image is the pinned image.
    data, media, digest = registry.get_manifest(ref.reference)
    manifest = _json_object(data, f"manifest of {source}")
    if media in INDEXES or manifest.get("mediaType") in INDEXES:
        chosen = next((m for m in manifest.get("manifests") or [] if is_linux_amd64(m)), None)
        if chosen is None:
            raise BaseImageError(f"image {source} has no linux/amd64 image")
        data, media, digest = registry.get_manifest(Descriptor.from_dict(chosen, f"index of {source}").digest)
        manifest = _json_object(data, f"manifest of {source}")
    return data, media, digest, manifest


def _pull(source: str, ref: ImageRef) -> BaseImage:
    with Registry(ref) as registry:
        data, media, digest, manifest = platform_manifest(registry, ref, source)
        layout = Layout(_cache(f"registry:{digest}"))
        blobs = [Descriptor.from_dict(d, f"manifest of {source}") for d in [manifest.get("config"),
                                                                              *(manifest.get("layers") or [])]]
        for desc in blobs:
            if not layout.has(desc.digest):
                registry.get_blob(desc.digest, layout.blob_path(desc.digest))
        stored = layout.put_bytes(data, media or OCI_MANIFEST)
        layout.write_index(stored, "base")
    _pin(source).parent.mkdir(parents=True, exist_ok=True)
    _pin(source).write_text(digest)
    return _from_layout(source, layout, None)


def local_layout(parsed: ImageSource) -> tuple[Layout, str | None]:
    """The OCI layout an oci:, oci-archive: or docker-archive: reference reads from, and its tag."""
    if parsed.kind not in {"oci", "oci-archive", "docker-archive"}:
        raise InputError(f"{parsed.text!r} is not a local image (oci:, oci-archive:, docker-archive:)")
    if not parsed.path.exists():
        raise BaseImageError(f"image {parsed.text}: {parsed.path} does not exist",
                             hint="check the path; `skopeo copy docker://python:3.11-slim oci:DIR:TAG` makes a layout")
    if parsed.kind == "oci":
        return Layout(parsed.path), parsed.tag
    if parsed.kind == "oci-archive":
        return _oci_archive_layout(parsed.text, parsed.path), parsed.tag
    return _docker_archive_layout(parsed.text, parsed.path), None


def load_base(source: str, offline: bool = False) -> BaseImage:
    """The base's config and layers; offline: a registry base only as it was last pulled, else an error."""
    parsed = parse_image_source(source)
    if parsed.kind == "dir":
        raise BaseImageError(f"base image {source!r} is a folder, not an image reference",
                             hint="write oci:DIR[:TAG] for an OCI layout folder")
    if parsed.kind == "name":
        return _from_registry(source, offline)
    return _from_layout(source, *local_layout(parsed))
