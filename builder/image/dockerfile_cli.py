"""Backends that build the rendered Dockerfile with a container CLI: docker, podman, buildah.

The Dockerfile has no RUN step, so none of them needs a container runtime or network to build.
Podman and buildah write Docker-format images: only that format keeps the HEALTHCHECK for them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from builder.errors import BaseImageError, ImageBuildError, StorageMismatch
from builder.image.base import ImageResult
from builder.image.spec import ImageSpec
from builder.oci.base import NO_REGISTRY_FIXES
from builder.oci.refs import parse_image_source, parse_ref
from builder.oci.registry import is_insecure
from builder.settings import host_settings


class DockerfileCli:
    name = "docker"
    executable = "docker"

    def __init__(self, offline: bool = False) -> None:
        self.offline = offline  # --offline: the tool must not pull the base from a registry

    def global_args(self) -> list[str]:
        return []

    def _run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.executable, *self.global_args(), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def probe(self) -> list[str]:
        """A quick command that succeeds only when the tool can build."""
        return ["version"]

    # What to do when the tool is installed but refuses to work; each CLI names its own fix.
    fix = "start the engine (or set DOCKER_HOST), or use --backend none for the context"

    def unavailable(self) -> ImageBuildError | None:
        if shutil.which(self.executable) is None:
            return ImageBuildError(f"the {self.executable} CLI is not installed",
                                   hint=f"install {self.executable}, or use --backend oci (no daemon needed)")
        try:
            result = self._run(*self.probe(), timeout=15)
        except subprocess.TimeoutExpired:
            return ImageBuildError(f"{self.executable} did not answer within 15 s", hint=self.fix)
        if result.returncode != 0:
            return self.refused((result.stderr.strip().splitlines() or ["?"])[-1])
        return None

    def refused(self, last_line: str) -> ImageBuildError:
        return ImageBuildError(f"{self.executable} cannot build here ({last_line})", hint=self.fix)

    def build_command(self, context: Path, tag: str) -> list[str]:
        return ["build", "--network", "host", "--tag", tag, str(context)]

    def image_info(self, image: str) -> dict[str, Any] | None:
        """`TOOL image inspect IMAGE`'s entry (with this tool's storage settings); None if it holds no such image."""
        if shutil.which(self.executable) is None:
            return None
        try:
            result = self._run("image", "inspect", image)
            entries = json.loads(result.stdout) if result.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None
        return entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else None

    def history(self, image: str) -> list[tuple[str, int]]:
        """(what made it, bytes) for each non-empty layer, base first."""
        result = self._run("history", "--human=false", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image)
        layers = []
        for line in reversed(result.stdout.strip().splitlines()):  # history lists newest first
            size, _, made = line.partition("\t")
            if size.strip().isdigit() and int(size) > 0:
                layers.append((made.strip(), int(size)))
        return layers

    def check_base(self, base_image: str, python: str | None) -> None:
        """Offline, a registry base must already be among this tool's images (it would pull it at build time)."""
        if self.offline and parse_image_source(base_image).kind == "name" and self.existing(base_image) is None:
            raise BaseImageError(f"base image {base_image} is not among {self.name}'s images, and --offline forbids "
                                 "pulling it", hint=NO_REGISTRY_FIXES)

    def existing(self, tag: str, context: Path | None = None) -> ImageResult | None:
        info = self.image_info(tag)
        if info is None:
            return None
        return ImageResult(tag=tag, image_id=info["Id"] if ":" in info["Id"] else f"sha256:{info['Id']}",
                           size_bytes=info.get("Size"), backend=self.name, reused=True)

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult:
        command = [self.executable, *self.global_args(), *self.build_command(context, tag)]
        with log_file.open("w") as log:
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            try:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=3600,
                                      check=False).returncode
            except subprocess.TimeoutExpired as exc:
                raise ImageBuildError(f"{self.name} build ran for over an hour and was stopped",
                                      hint=f"see {log_file}") from exc
        if code != 0:
            tail = "\n".join(log_file.read_text(errors="replace").strip().splitlines()[-12:])
            raise ImageBuildError(f"{self.name} build failed (exit {code}):\n{tail}", hint=f"full log: {log_file}")
        image = self.existing(tag)
        if image is None:
            raise ImageBuildError(f"{self.name} build succeeded but {tag} is not among its images")
        return ImageResult(image.tag, image.image_id, image.size_bytes, self.name, reused=False)


class DockerBackend(DockerfileCli):
    """The docker CLI against whatever engine DOCKER_HOST (or the default socket) names."""

    def probe(self) -> list[str]:
        return ["version", "--format", "{{.Server.Version}}"]

    def build_command(self, context: Path, tag: str) -> list[str]:
        # Host network: some hosts have no bridge, and the Dockerfile fetches nothing anyway.
        if self._run("buildx", "version").returncode == 0:
            return ["buildx", "build", "--load", "--network", "host", "--tag", tag, str(context)]
        return super().build_command(context, tag)


class _ContainersStorage(DockerfileCli):
    """podman and buildah share containers-storage; MBUILD_CONTAINERS_STORAGE_DRIVER picks its driver."""

    fix = ("check `{tool} info`; point CONTAINERS_STORAGE_CONF at a storage.conf that names the graph driver, "
           "graph root and run root, or use --backend oci (no daemon needed)")

    def global_args(self) -> list[str]:
        driver = host_settings().storage_driver
        return ["--storage-driver", driver] if driver else []

    def refused(self, last_line: str) -> ImageBuildError:
        # podman keeps the driver its storage was first set up with in its database and refuses any other.
        mismatch = re.search(r'database storage graph driver "([^"]*)" does not match our storage graph driver '
                             r'"([^"]*)"', last_line)
        if mismatch:
            stored, asked = mismatch.groups()  # stored is "" when the host's default driver set it up
            match = f"set MBUILD_CONTAINERS_STORAGE_DRIVER={stored}" if stored else \
                "unset MBUILD_CONTAINERS_STORAGE_DRIVER (the storage uses the host's default driver)"
            return StorageMismatch(
                f"{self.executable}'s containers-storage was set up with the graph driver "
                f"{repr(stored) if stored else 'the host defaults to'}, but this build asks for {asked!r}",
                hint=f"{match} to match the host's storage, or point CONTAINERS_STORAGE_CONF at a storage.conf "
                     "with its own graphroot and runroot for that driver")
        return ImageBuildError(f"{self.executable} cannot build here ({last_line})",
                               hint=self.fix.format(tool=self.executable))

    def _tls(self, context: Path) -> list[str]:
        base = parse_image_source(ImageSpec.load(context).base_image)  # oci:, archives: read from disk, no TLS
        return ["--tls-verify=false"] if base.kind == "name" and is_insecure(parse_ref(base.text).registry) else []


class PodmanBackend(_ContainersStorage):
    name = executable = "podman"

    def probe(self) -> list[str]:
        return ["info", "--format", "{{.Store.GraphDriverName}}"]

    def build_command(self, context: Path, tag: str) -> list[str]:
        return ["build", "--format", "docker", "--network", "host", *self._tls(context), "--tag", tag, str(context)]


class BuildahBackend(_ContainersStorage):
    name = executable = "buildah"

    def probe(self) -> list[str]:
        return ["info"]

    def build_command(self, context: Path, tag: str) -> list[str]:
        return ["build", "--format", "docker", "--isolation", "chroot", *self._tls(context), "--tag", tag,
                str(context)]

    def existing(self, tag: str, context: Path | None = None) -> ImageResult | None:
        result = self._run("inspect", "--type", "image", tag)
        if result.returncode != 0:
            return None
        info = json.loads(result.stdout)
        image_id = info.get("FromImageID", "")
        size = sum(int(layer.get("Size", 0) or 0) for layer in info.get("OCIv1", {}).get("layers", []) or [])
        return ImageResult(tag=tag, image_id=f"sha256:{image_id}", size_bytes=size or None, backend=self.name,
                           reused=True)


# The engines that hold images under a name (buildah's images live in podman's storage): push and inspect ask them.
ENGINES: dict[str, type[DockerfileCli]] = {"docker": DockerBackend, "podman": PodmanBackend}
