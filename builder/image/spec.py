"""ImageSpec: everything an image is, in one frozen object that every backend reads.

The Dockerfile (docker, podman, buildah) is rendered from it and the daemonless OCI writer turns it
into a config and layers directly, so the backends cannot drift apart. Saved as image-spec.json in
the build directory so a later `mbuild push` or rebuild reads the same thing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.oci.layers import Copy
from builder.settings import host_settings
from runtimes.settings import MODEL_DIR, PORT

SPEC_FILE = "image-spec.json"
UID = 10001  # the image's user (not root); manifests run the pod as it
ROOT = MODEL_DIR.parent.as_posix()  # /opt/mbuild: the image's own files


def source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH, or 0 (1970-01-01) as ko and Bazel do: no date makes two builds differ."""
    return host_settings().source_date_epoch


def timestamp(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval_s: int = 5
    timeout_s: int = 3
    start_period_s: int = 120
    retries: int = 3


# Ordered from least to most often changed, so rebuilds reuse the big layers.
COPIES = (
    Copy(("site",), f"{ROOT}/site"),
    Copy(("app",), f"{ROOT}/app"),
    Copy(("model",), MODEL_DIR.as_posix()),
    Copy(("mbuild.lock", "bom.json"), f"{ROOT}/"),
)


def default_env(device: str = "cpu") -> tuple[tuple[str, str], ...]:
    # NVIDIA's container toolkit reads these to mount the driver and expose the GPUs.
    gpu = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")) \
        if device == "gpu" else ()
    return (
        ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        ("PYTHONPATH", f"{ROOT}/app:{ROOT}/site"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
        ("HOME", "/tmp"),
        ("BENTOML_HOME", "/tmp/bentoml"),
        ("BENTOML_DO_NOT_TRACK", "true"),
        ("MBUILD_MODEL_DIR", MODEL_DIR.as_posix()),
        ("MBUILD_SITE", f"{ROOT}/site"),
        # No MBUILD_PORT: the runtime listens on PORT unless told, and one set here would hide NIM_SERVER_PORT.
        *gpu,
    )


@dataclass(frozen=True)
class ImageSpec:
    base_image: str
    labels: dict[str, str]
    model_id: str
    mbuild_version: str
    created: str
    env: tuple[tuple[str, str], ...] = field(default_factory=default_env)
    copies: tuple[Copy, ...] = COPIES
    uid: int = UID
    port: int = PORT
    healthcheck: Healthcheck = Healthcheck(("python3", "-m", "runtimes.healthcheck"))
    stop_signal: str = "SIGTERM"
    entrypoint: tuple[str, ...] = ("python3", "-m", "runtimes")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageSpec:
        return cls(
            **{k: v for k, v in raw.items() if k not in {"env", "copies", "healthcheck", "entrypoint"}},
            env=tuple((k, v) for k, v in raw["env"]),
            copies=tuple(Copy(tuple(c["sources"]), c["dest"]) for c in raw["copies"]),
            healthcheck=Healthcheck(**{**raw["healthcheck"], "test": tuple(raw["healthcheck"]["test"])}),
            entrypoint=tuple(raw["entrypoint"]),
        )

    @classmethod
    def load(cls, build_dir: Path) -> ImageSpec:
        return cls.from_dict(json.loads((build_dir / SPEC_FILE).read_text()))
