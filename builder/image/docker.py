"""Docker backend: the docker CLI against whatever engine DOCKER_HOST (or the default socket) names."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from builder.errors import ImageBuildError
from builder.image.base import ImageResult


class DockerBackend:
    name = "docker"

    def __init__(self, executable: str = "docker") -> None:
        self.executable = executable

    def _run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.executable, *args], capture_output=True, text=True, timeout=timeout, check=False)

    def why_unavailable(self) -> str:
        if shutil.which(self.executable) is None:
            return "the docker CLI is not installed"
        try:
            result = self._run("version", "--format", "{{.Server.Version}}", timeout=10)
        except subprocess.TimeoutExpired:
            return "the Docker engine did not answer within 10 s"
        if result.returncode != 0:
            return "no Docker engine answers (" + (result.stderr.strip().splitlines() or ["?"])[-1] + ")"
        return ""

    def available(self) -> bool:
        return self.why_unavailable() == ""

    def existing(self, tag: str, context: Path | None = None) -> ImageResult | None:
        result = self._run("image", "inspect", tag)
        if result.returncode != 0:
            return None
        info = json.loads(result.stdout)[0]
        return ImageResult(tag=tag, image_id=info["Id"], size_bytes=info.get("Size"), backend=self.name, reused=True)

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult:
        # Host network: builds here have no bridge, and the Dockerfile fetches nothing anyway.
        command = [self.executable, "build", "--network", "host", "--tag", tag, str(context)]
        with log_file.open("w") as log:
            try:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=3600,
                                      check=False).returncode
            except subprocess.TimeoutExpired as exc:
                raise ImageBuildError("docker build ran for over an hour and was stopped",
                                      hint=f"see {log_file}") from exc
        if code != 0:
            tail = "\n".join(log_file.read_text(errors="replace").strip().splitlines()[-12:])
            raise ImageBuildError(f"docker build failed (exit {code}):\n{tail}", hint=f"full log: {log_file}")
        image = self.existing(tag)
        if image is None:
            raise ImageBuildError(f"docker build succeeded but {tag} is not in the engine's images")
        return ImageResult(image.tag, image.image_id, image.size_bytes, self.name, reused=False)
