"""The daemonless backend: writes an OCI image layout straight from the build context.

No Docker, no RUN step, no root: base layers are reused as they are, each COPY of the ImageSpec
becomes one deterministic layer, and the config carries the same Env, User, Labels, Healthcheck
and Entrypoint the Dockerfile declares. With the same inputs and SOURCE_DATE_EPOCH the image
digest is the same on every build. The layout lands in BUILD_DIR/oci (tag: the image tag).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from builder.errors import ImageBuildError
from builder.hashing import sha256_file, tree_digest
from builder.image.base import ImageResult
from builder.image.spec import ImageSpec, source_date_epoch, timestamp
from builder.oci.base import BaseImage, load_base
from builder.oci.basepython import check_python, plan_python
from builder.oci.layers import Copy, LayerBlob, build_layer
from builder.oci.layout import REF_NAME, Descriptor, Layout, canonical
from builder.oci.media import CONFIG, LAYER, MANIFEST, Format
from builder.resources import mbuild_cache_dir

NANOSECONDS = 1_000_000_000
LAYOUT_DIR = "oci"


def _cached_layer(context: Path, copy: Copy, epoch: int, work: Path) -> LayerBlob:
    """Big layers (packages, model) rarely change: keep their blobs keyed by content."""
    key_parts = [copy.dest, str(epoch)]
    for source in copy.sources:
        path = context / source
        key_parts.append(f"{source}={tree_digest(path) if path.is_dir() else sha256_file(path)}")
    key = hashlib.sha256("\n".join(key_parts).encode()).hexdigest()
    cached = mbuild_cache_dir() / "layers" / key
    meta = cached.with_suffix(".ids")
    if cached.is_file() and meta.is_file():
        digest, diff_id = meta.read_text().split()
        return LayerBlob(cached, digest, diff_id, cached.stat().st_size)
    blob = build_layer(context, copy, work / f"{key}.tar.gz", epoch)
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(blob.path, cached)
    meta.write_text(f"{blob.digest} {blob.diff_id}\n")
    return LayerBlob(cached, blob.digest, blob.diff_id, blob.size)


def _describe(copy: Copy) -> str:
    return f"COPY {' '.join(copy.sources)} {copy.dest}"


def image_config(base: BaseImage, spec: ImageSpec, diff_ids: list[str], epoch: int) -> dict[str, Any]:
    created = timestamp(epoch)
    inherited = dict(base.config.get("config") or {})
    env = dict(item.split("=", 1) for item in inherited.get("Env") or [] if "=" in item)
    env.update(dict(spec.env))
    hc = spec.healthcheck
    container = {
        **inherited,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Entrypoint": list(spec.entrypoint),
        "Cmd": None,
        "User": f"{spec.uid}:{spec.uid}",
        "ExposedPorts": {**(inherited.get("ExposedPorts") or {}), f"{spec.port}/tcp": {}},
        "Labels": {**(inherited.get("Labels") or {}), **spec.labels},
        "StopSignal": spec.stop_signal,
        "Healthcheck": {"Test": ["CMD", *hc.test], "Interval": hc.interval_s * NANOSECONDS,
                        "Timeout": hc.timeout_s * NANOSECONDS, "StartPeriod": hc.start_period_s * NANOSECONDS,
                        "Retries": hc.retries},
    }
    history = list(base.config.get("history") or [])
    history += [{"created": created, "created_by": f"mbuild {spec.mbuild_version}: {_describe(c)}"}
                for c in spec.copies]
    history.append({"created": created, "created_by": f"mbuild {spec.mbuild_version}: LABEL ENV USER EXPOSE "
                    "HEALTHCHECK ENTRYPOINT", "empty_layer": True})
    return {
        "created": created,
        "architecture": base.config.get("architecture", "amd64"),
        "os": base.config.get("os", "linux"),
        "config": container,
        "rootfs": {"type": "layers", "diff_ids": list(base.config["rootfs"]["diff_ids"]) + diff_ids},
        "history": history,
    }


class OciBackend:
    name = "oci"

    def __init__(self, fmt: Format = "oci", offline: bool = False) -> None:
        self.format: Format = fmt
        self.offline = offline  # a registry base only as last pulled: no registry is contacted
        self.base: BaseImage | None = None  # the one check_base read, so build does not read it again

    def unavailable(self) -> ImageBuildError | None:
        return None  # pure Python: it runs wherever mbuild does

    def check_base(self, base_image: str, python: str | None) -> None:
        self.base = load_base(base_image, self.offline)  # pulled now, not after the gate
        check_python(self.base, python)

    def existing(self, tag: str, context: Path) -> ImageResult | None:
        layout = Layout(context / LAYOUT_DIR)
        try:
            desc, manifest = layout.manifest(tag)
        except Exception:  # no layout yet, or not this tag: build it
            return None
        size = sum(layer["size"] for layer in manifest["layers"])
        return ImageResult(tag, manifest["config"]["digest"], size, self.name, reused=True, digest=desc.digest)

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult:
        spec = ImageSpec.load(context)
        epoch = source_date_epoch()
        base = self.base if self.base is not None and self.base.source == spec.base_image else \
            load_base(spec.base_image, self.offline)
        check_python(base, plan_python(context))  # before writing anything: a base that cannot run is no image
        out = context / LAYOUT_DIR
        shutil.rmtree(out, ignore_errors=True)
        layout = Layout(out)
        fmt = self.format
        layers: list[dict[str, Any]] = []
        sizes: list[tuple[str, int]] = []
        for desc, path in base.layers:
            layout.put_file(path, desc.digest, LAYER[fmt])
            layers.append(Descriptor(LAYER[fmt], desc.digest, desc.size).to_dict())
            sizes.append((f"base {spec.base_image}", desc.size))
        diff_ids = []
        for copy in spec.copies:
            blob = _cached_layer(context, copy, epoch, out)
            layers.append(layout.put_file(blob.path, blob.digest, LAYER[fmt]).to_dict())
            diff_ids.append(blob.diff_id)
            sizes.append((_describe(copy), blob.size))
        config = layout.put_bytes(canonical(image_config(base, spec, diff_ids, epoch)), CONFIG[fmt])
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST[fmt], "config": config.to_dict(), "layers": layers}
        stored = layout.put_bytes(canonical(manifest), MANIFEST[fmt])
        layout.write_index(stored, tag)
        log_file.write_text("".join(f"{size:>12}  {what}\n" for what, size in sizes)
                            + f"manifest {stored.digest}\nconfig {config.digest}\nref {REF_NAME}={tag}\n")
        return ImageResult(tag, config.digest, sum(s for _, s in sizes), self.name, digest=stored.digest,
                           layers=tuple(sizes))
