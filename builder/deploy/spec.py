"""What a deployment needs to know of a build, read from its plan (plan.json of a build directory, or
`mbuild plan --json`) and its image record: the image by digest, the task, the profile's memory and GPUs, the
routes and the drain. Every manifest format is written from this one object."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import InputError
from builder.image.push import read_record
from builder.oci.refs import parse_ref

PORT = 8000
LIVE, READY, METRICS = "/v1/health/live", "/v1/health/ready", "/v1/metrics"
GRACE_SECONDS = 20  # the runtime's MBUILD_GRACE_SECONDS: readiness 503, drain, in-flight requests finish
UID = 10001  # the image's user
_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class DeploySpec:
    name: str  # a DNS-1123 label: the objects' names
    image: str  # repo@sha256:... where the digest is known
    task: str  # embedding | text-generation
    profile: str
    profile_id: str
    model: str
    memory_gib: int  # the profile's measured need, rounded up: the request and the limit
    gpus: int
    compute_capabilities: tuple[str, ...]
    max_batch: int
    version: str  # the build's image tag: the chart's appVersion
    namespace: str | None = None

    @property
    def startup_seconds(self) -> int:
        """How long the pod may take to load: a floor, plus reading the weights at 0.5 GB/s, doubled. The build
        does not measure the image's load time yet; the image's own HEALTHCHECK allows 120 s."""
        return max(120, 2 * (60 + math.ceil(self.memory_gib * 2)))

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/managed-by": "mbuild",
                "app.kubernetes.io/component": self.task, "dev.mbuild/profile-id": self.profile_id[:12]}

    @property
    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name}


def dns_label(text: str) -> str:
    label = _NAME.sub("-", text.lower()).strip("-")[:63].strip("-")
    if not label:
        raise InputError(f"cannot make a Kubernetes name of {text!r}", hint="give one with --name")
    return label


def split_image(ref: str) -> tuple[str, str, str]:
    """(repository, tag, digest) as written, without the normalising parse_ref does (docker.io/library/...)."""
    rest, _, digest = ref.partition("@")
    tag = ""
    if ":" in rest.rsplit("/", 1)[-1]:
        rest, tag = rest.rsplit(":", 1)
    return rest, tag, digest


def _plan_and_image(source: Path) -> tuple[dict[str, Any], str | None]:
    """The plan, and the image's digest reference when the build made one."""
    if source.is_dir():
        plan_file, record = source / "plan.json", read_record(source)
    else:
        plan_file, record = source, None
    try:
        plan = json.loads(plan_file.read_text())
        plan["tag"], plan["requires"], plan["profile"]["content"]  # the fields read below must be there
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{source} is not a build directory or an `mbuild plan --json` file ({exc})",
                         hint="give the folder `mbuild package` wrote, or save `mbuild plan MODEL --json`") from exc
    digest = None
    if record is not None:
        raw = json.loads((source / "image.json").read_text())
        if raw.get("digest"):
            digest = f"{split_image(record.tag)[0]}@{raw['digest']}"
    return plan, digest


def load_spec(source: Path, image: str | None = None, name: str | None = None,
              namespace: str | None = None) -> DeploySpec:
    plan, built = _plan_and_image(source)
    chosen = image or built or plan["tag"]
    parse_ref(chosen)  # a malformed --image is an InputError here, not a manifest the cluster rejects
    requires, content = plan["requires"], plan["profile"]["content"]
    gpus = int(requires.get("gpus") or 0) if requires.get("device") == "gpu" else 0
    return DeploySpec(
        name=dns_label(name or plan["tag"].split(":")[0].rsplit("/", 1)[-1]),
        image=chosen, task=str(plan.get("task") or "embedding"), profile=str(plan["profile"]["name"]),
        profile_id=str(plan["profile"]["id"]), model=str(plan["model"]["repo"]),
        memory_gib=max(1, math.ceil(float(requires.get("memory_gb") or 1) / 1.073741824)), gpus=gpus,
        compute_capabilities=tuple(requires.get("compute_capabilities") or ()),
        max_batch=int(content.get("limits", {}).get("max_batch") or 8),
        version=split_image(plan["tag"])[1] or "latest", namespace=namespace)
