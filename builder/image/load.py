"""`mbuild load`: an image the OCI writer built (or any oci: layout) into docker's or podman's image store.

Both engines load what `docker save` writes, so the layout is streamed to `ENGINE load` as that archive:
manifest.json, the config, and each layer as an uncompressed tar (their diff_ids are the config's). Nothing
is written to disk beside it, and no registry is involved.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import ImageBuildError, InputError, ToolMissing
from builder.image.oci import LAYOUT_DIR
from builder.image.push import read_record
from builder.oci.layout import Layout
from builder.oci.refs import parse_image_source

CHUNK = 1 << 20


@dataclass(frozen=True)
class LoadResult:
    engine: str
    tag: str
    digest: str  # the manifest digest of what was loaded (the OCI writer's, reproducible)


def _layout_of(source: str) -> tuple[Path, str | None]:
    parsed = parse_image_source(source)
    if parsed.kind == "oci":
        return parsed.path, parsed.tag
    record = read_record(parsed.path) if parsed.kind == "dir" else None
    if record is None or record.backend != "oci":
        held = f"it was built by {record.backend}, which holds it already" if record else "it holds no image.json"
        raise InputError(f"{source} is not an image the OCI writer built ({held})",
                         hint="give a build directory packaged with --backend oci, or oci:DIR:TAG")
    return parsed.path / LAYOUT_DIR, record.tag


def _unpacked_size(blob: Path) -> int:
    size = 0
    with gzip.open(blob, "rb") as layer:
        while chunk := layer.read(CHUNK):
            size += len(chunk)
    return size


def write_archive(layout: Layout, tag: str | None, name: str, sink: IO[bytes]) -> str:
    """`docker save`'s archive of the layout's image under `name`, to sink; returns the manifest digest."""
    desc, manifest = layout.manifest(tag)
    config_hex = manifest["config"]["digest"].split(":", 1)[1]
    config = layout.verified_blob(manifest["config"]["digest"]).read_bytes()
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(arcname: str, data: IO[bytes] | gzip.GzipFile, size: int) -> None:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = size, 0o644
            tar.addfile(info, data)

        add(f"{config_hex}.json", io.BytesIO(config), len(config))
        names = []
        for entry, diff_id in zip(manifest["layers"], diff_ids, strict=True):
            blob = layout.verified_blob(entry["digest"])
            names.append(f"{diff_id.split(':', 1)[1]}/layer.tar")
            with gzip.open(blob, "rb") as layer:
                add(names[-1], layer, _unpacked_size(blob))
        listing = json.dumps([{"Config": f"{config_hex}.json", "RepoTags": [name], "Layers": names}]).encode()
        add("manifest.json", io.BytesIO(listing), len(listing))
    return desc.digest


def load(source: str, engine: str | None = None, name: str | None = None) -> LoadResult:
    """name: what the engine lists it as (default: the layout's tag)."""
    layout_dir, tag = _layout_of(source)
    layout = Layout(layout_dir)
    engines = [engine] if engine else ["podman", "docker"]
    chosen = next((e for e in engines if shutil.which(e)), None)
    if chosen is None:
        raise ToolMissing(f"{' or '.join(engines)} is not installed",
                          hint="install podman (apt-get install podman) or docker, or run the layout with any "
                               "OCI runtime; `mbuild push` sends it to a registry")
    name = name or tag or "mbuild/image:latest"
    process = subprocess.Popen([chosen, "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    assert process.stdin is not None and process.stdout is not None
    try:
        digest = write_archive(layout, tag, name, process.stdin)
        process.stdin.close()
    except BrokenPipeError:
        pass  # the engine stopped reading: its own message says why
    output = process.stdout.read().decode(errors="replace")
    if process.wait() != 0:
        raise ImageBuildError(f"{chosen} load failed: {output.strip()[-800:]}",
                              hint=f"check that {chosen} runs (`{chosen} info`)")
    return LoadResult(chosen, name, digest)
