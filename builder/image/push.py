"""`mbuild push`: an image (or a build directory's image) to any OCI distribution registry.

The tool is the one that holds the image: an OCI layout goes with skopeo when installed, else the
built-in client (both keep the digest); a Docker, podman or buildah image goes with skopeo or the
engine's own push. Afterwards the registry is asked for the tag's digest, and it must match.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.errors import ImageBuildError, InputError, ToolMissing
from builder.image.dockerfile_cli import ENGINES
from builder.image.oci import LAYOUT_DIR
from builder.oci.layout import Layout
from builder.oci.push import push_layout, remote_digest
from builder.oci.refs import ImageRef, ImageSource, parse_image_source, parse_ref
from builder.oci.registry import is_insecure
from runtimes.bundle.codec import ContractError, check_format, decode, write_contract

IMAGE_RECORD = "image.json"  # which backend built the build directory's image, under which tag
IMAGE_FORMAT = 1


@dataclass(frozen=True)
class PushResult:
    destination: str
    digest: str  # what the registry serves under the tag now
    local_digest: str | None  # the manifest digest before pushing, where the source has one
    tool: str


@dataclass(frozen=True)
class ImageRecord:
    """image.json: which backend built a build directory's image, under which tag, and its ids."""

    backend: str
    tag: str
    image_id: str
    digest: str | None  # the manifest digest, where the backend knows it
    format: int = IMAGE_FORMAT

    @property
    def engine(self) -> str:
        """The engine that holds the image under its tag (buildah's images live in podman's storage)."""
        return "podman" if self.backend in {"podman", "buildah"} else "docker"


def read_record(build_dir: Path) -> ImageRecord | None:
    """The build directory's image.json; None where no image was built. One that cannot be read, or of another
    format, is an InputError: guessing would push or deploy the wrong image."""
    path = build_dir / IMAGE_RECORD
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        check_format(raw, IMAGE_RECORD, IMAGE_FORMAT)
        return decode(ImageRecord, raw, IMAGE_RECORD)
    except (OSError, ValueError, ContractError) as exc:
        raise InputError(f"{path} is not a readable image record: {exc}",
                         hint="package the build directory again with this mbuild") from exc


def record_image(build_dir: Path, backend: str, tag: str, image_id: str, digest: str | None) -> None:
    write_contract(build_dir / IMAGE_RECORD, ImageRecord(backend, tag, image_id, digest))


def _skopeo(source: str, destination: ImageRef, extra: list[str]) -> str:
    tls = [] if not is_insecure(destination.registry) else ["--dest-tls-verify=false"]
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        command = ["skopeo", "copy", "--quiet", "--digestfile", str(digest_file), *tls, *extra, source,
                   f"docker://{destination}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
        if result.returncode != 0:
            raise ImageBuildError(f"skopeo could not push to {destination}: {result.stderr.strip()[-800:]}",
                                  hint="check the registry address and credentials (docker login)")
        return digest_file.read_text().strip()


def _engine_push(tool: str, image: str, destination: ImageRef) -> str:
    if tool == "docker":
        if subprocess.run(["docker", "tag", image, str(destination)], capture_output=True, check=False).returncode:
            raise ImageBuildError(f"docker cannot tag {image} as {destination}")
        command = ["docker", "push", str(destination)]
    else:
        tls = ["--tls-verify=false"] if is_insecure(destination.registry) else []
        command = [tool, "push", *tls, image, f"docker://{destination}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"{tool} push to {destination} failed: {(result.stderr or result.stdout)[-800:]}")
    return ""


def _verify(destination: ImageRef, reported: str, local: str | None, tool: str) -> PushResult:
    served = remote_digest(destination)
    for name, value in (("the push reported", reported), ("the local image has", local)):
        if value and value != served:
            raise ImageBuildError(f"digest mismatch after push: the registry serves {served}, {name} {value}")
    return PushResult(str(destination), served, local, tool)


def push_layout_dir(layout_dir: Path, tag: str | None, destination: ImageRef) -> PushResult:
    local = Layout(layout_dir).manifest(tag)[0].digest  # also checks the layout before anything is sent
    if shutil.which("skopeo"):
        reported = _skopeo(f"oci:{layout_dir}" + (f":{tag}" if tag else ""), destination, ["--preserve-digests"])
        return _verify(destination, reported, local, "skopeo")
    _, reported = push_layout(layout_dir, tag, destination)
    return _verify(destination, reported, local, "built-in client")


def push_engine_image(tool: str, image: str, destination: ImageRef, fmt: str) -> PushResult:
    """An image held by docker or containers-storage (podman, buildah)."""
    if shutil.which("skopeo"):
        transport = "docker-daemon" if tool == "docker" else "containers-storage"
        reported = _skopeo(f"{transport}:{image}", destination, ["--format", fmt])
        return _verify(destination, reported, None, f"skopeo from {tool}")
    _engine_push(tool, image, destination)
    return _verify(destination, "", None, tool)


def _engine_holding(image: str) -> str | None:
    return next((tool for tool, cli in ENGINES.items() if cli().image_info(image) is not None), None)


def _push_archive(source: ImageSource, destination: ImageRef) -> PushResult:
    """oci-archive: and docker-archive: go with skopeo, which reads them; the built-in client reads layouts."""
    if not source.path.is_file():
        raise InputError(f"{source.text}: no such file {source.path}")
    if not shutil.which("skopeo"):
        raise ToolMissing(f"pushing {source.kind}: needs skopeo",
                          hint=f"install skopeo, or unpack it: skopeo copy {source.text} oci:DIR:TAG")
    reported = _skopeo(source.text, destination, ["--preserve-digests"] if source.kind == "oci-archive" else [])
    return _verify(destination, reported, None, "skopeo")


def push(source: str, destination: str, fmt: str = "v2s2") -> PushResult:
    """source: a build directory, oci:DIR[:TAG], oci-archive:/docker-archive:FILE, or an image an engine holds."""
    dest = parse_ref(destination)
    parsed = parse_image_source(source)
    if parsed.kind == "oci":
        return push_layout_dir(parsed.path, parsed.tag, dest)
    if parsed.kind in {"oci-archive", "docker-archive"}:
        return _push_archive(parsed, dest)
    path = parsed.path
    record = read_record(path) if parsed.kind == "dir" else None
    if record is not None:
        if record.backend == "oci":
            return push_layout_dir(path / LAYOUT_DIR, record.tag, dest)
        return push_engine_image(record.engine, record.tag, dest, fmt)
    if parsed.kind == "dir":
        raise InputError(f"{source} holds no built image (no {IMAGE_RECORD})" if path.is_dir() else
                         f"no such folder: {source}",
                         hint="package it with an image backend first (--backend docker|podman|buildah|oci)")
    holder = _engine_holding(source)
    if holder is None:
        raise InputError(f"no local image {source!r} in docker or podman",
                         hint="give a build directory, oci:DIR:TAG, or an image name `docker images` lists")
    return push_engine_image(holder, source, dest, fmt)
