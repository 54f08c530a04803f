"""Base images for the daemonless OCI writer: from a registry, a local OCI layout, or a tar.

    oci:PATH[:TAG]             an OCI image layout folder (skopeo copy ... oci:PATH:TAG makes one)
    oci-archive:PATH[:TAG]     the same, as a tar
    docker-archive:PATH        what `docker save` writes
    [registry/]name[:tag]      pulled with the distribution API into ~/.cache/mbuild/bases
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

from builder.errors import InputError
from builder.hashing import sha256_file
from builder.oci.layers import Hashing
from builder.oci.layout import Descriptor, Layout, canonical
from builder.oci.media import GZIP_LAYERS, INDEXES, OCI_CONFIG, OCI_LAYER, OCI_MANIFEST
from builder.oci.refs import parse_ref
from builder.oci.registry import Registry
from builder.resources import mbuild_cache_dir


@dataclass(frozen=True)
class BaseImage:
    source: str
    config: dict[str, Any]
    layers: tuple[tuple[Descriptor, Path], ...]  # gzip layers with the file that holds each


def _split_tag(text: str) -> tuple[Path, str | None]:
    path, _, tag = text.rpartition(":") if ":" in Path(text).name else (text, "", "")
    return Path(path or text), tag or None


def _from_layout(source: str, layout: Layout, tag: str | None) -> BaseImage:
    _, manifest = layout.manifest(tag)
    config = layout.read_json(manifest["config"]["digest"])
    layers = []
    for entry in manifest["layers"]:
        desc = Descriptor.from_dict(entry)
        if desc.media_type not in GZIP_LAYERS:
            raise InputError(f"base {source}: layer type {desc.media_type} is not supported (gzip layers are)")
        if not layout.has(desc.digest):
            raise InputError(f"base {source}: blob {desc.digest} is missing from the layout")
        layers.append((desc, layout.blob_path(desc.digest)))
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


def _from_docker_archive(source: str, archive: Path) -> BaseImage:
    """`docker save` output: uncompressed layers, converted once into a cached OCI layout."""
    cache = _cache(f"docker-archive:{sha256_file(archive)}")
    layout = Layout(cache)
    if not (cache / "index.json").is_file():
        work = cache.with_name(cache.name + ".unpacked")
        shutil.rmtree(work, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        if (work / "index.json").is_file() and (work / "blobs").is_dir():  # newer docker saves an OCI layout
            shutil.rmtree(cache, ignore_errors=True)
            work.rename(cache)
            return _from_layout(source, Layout(cache), None)
        entry = json.loads((work / "manifest.json").read_text())[0]
        config_bytes = (work / entry["Config"]).read_bytes()
        config_desc = layout.put_bytes(config_bytes, OCI_CONFIG)
        layers = [_gzip_into(layout, work / name).to_dict() for name in entry["Layers"]]
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc.to_dict(), "layers": layers}
        layout.write_index(layout.put_bytes(canonical(manifest), OCI_MANIFEST), "base")
        shutil.rmtree(work, ignore_errors=True)
    return _from_layout(source, layout, None)


def _from_registry(source: str) -> BaseImage:
    ref = parse_ref(source)
    with Registry(ref) as registry:
        data, media, digest = registry.get_manifest(ref.reference)
        manifest = json.loads(data)
        if media in INDEXES or manifest.get("mediaType") in INDEXES:
            chosen = next((m for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "amd64"
                           and m.get("platform", {}).get("os") == "linux"), None)
            if chosen is None:
                raise InputError(f"base {source} has no linux/amd64 image")
            data, media, digest = registry.get_manifest(chosen["digest"])
            manifest = json.loads(data)
        layout = Layout(_cache(f"registry:{digest}"))
        for desc in [manifest["config"], *manifest["layers"]]:
            if not layout.has(desc["digest"]):
                registry.get_blob(desc["digest"], layout.blob_path(desc["digest"]))
        stored = layout.put_bytes(data, media or OCI_MANIFEST)
        layout.write_index(stored, "base")
    return _from_layout(source, layout, None)


def load_base(source: str) -> BaseImage:
    if source.startswith("oci:"):
        path, tag = _split_tag(source.removeprefix("oci:"))
        return _from_layout(source, Layout(path), tag)
    if source.startswith("oci-archive:"):
        path, tag = _split_tag(source.removeprefix("oci-archive:"))
        cache = _cache(f"oci-archive:{sha256_file(path)}")
        if not (cache / "index.json").is_file():
            with tarfile.open(path) as tar:
                tar.extractall(cache, filter="data")
        return _from_layout(source, Layout(cache), tag)
    if source.startswith("docker-archive:"):
        return _from_docker_archive(source, Path(source.removeprefix("docker-archive:")))
    return _from_registry(source)

