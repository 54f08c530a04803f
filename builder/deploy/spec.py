"""What a deployment needs to know of a build, read from its plan (plan.json of a build directory, or
`mbuild plan --json`) and its image record: the image by digest, the task, the profile's memory and GPUs, the
routes and the drain. Every manifest format is written from this one object."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from builder.engine.report import REPORT_FILE, read_report
from builder.errors import InputError
from builder.image.inspect import inspect_target
from builder.image.push import read_record
from builder.image.spec import UID as UID  # the image's user, re-exported to manifests
from builder.oci.refs import parse_image_source, parse_ref
from builder.plan_record import PLAN_FILE, REWRITE_HINT, PlanRecord
from builder.planning.plan import DEPLOY_LABEL
from runtimes.bundle.codec import ContractError
from runtimes.health import LIVE as LIVE  # the runtime's routes, re-exported to manifests
from runtimes.health import METRICS as METRICS
from runtimes.health import READY as READY
from runtimes.settings import DRAIN_SECONDS as DRAIN_SECONDS  # the container's own, re-exported to manifests
from runtimes.settings import GRACE_SECONDS as GRACE_SECONDS
from runtimes.settings import PORT as PORT

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
    load_seconds: float | None = None  # the engine's load as the build's gate measured it (report.json)
    extras: tuple[str, ...] = ()  # optional parts the image carries (`mbuild package --with`)

    @property
    def startup_seconds(self) -> int:
        """How long the pod may take to become ready. Measured: 60 s (start, imports, a cold page cache) plus four
        times the load the build's gate timed (a node slower than the build machine, weights read from a cold
        disk). Without a measurement (a saved plan): the floor plus reading the weights at 0.5 GB/s, doubled.
        Never under the image's own HEALTHCHECK allowance, 120 s."""
        if self.load_seconds is not None:
            return max(120, 60 + math.ceil(4 * self.load_seconds))
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


def _measured_load(build_dir: Path) -> float | None:
    report = read_report(build_dir / REPORT_FILE)
    return report.load_seconds if report else None


def _checked_plan(text: str, source: str) -> PlanRecord:
    try:
        return PlanRecord.parse(text, source)
    except ContractError as exc:
        raise InputError(f"{source} is not a build directory, an `mbuild plan --json` file or an image mbuild "
                         f"built ({exc})", hint="give the folder `mbuild package` wrote, save `mbuild plan MODEL "
                                                f"--json`, or name the image; a plan of another mbuild: "
                                                f"{REWRITE_HINT}") from exc


def _from_image(target: str, image: str | None) -> tuple[PlanRecord, str]:
    """The plan summary the image carries as a label, and the image as a cluster would pull it: --image, else by
    the digest the registry or engine knows. A local layout or archive is not pullable: --image is needed."""
    found = inspect_target(target)
    label = found.labels.get(DEPLOY_LABEL)
    if label is None:
        raise InputError(f"{target} carries no {DEPLOY_LABEL} label: mbuild did not build it, or an older mbuild did",
                         hint="give its build directory, or a plan saved with `mbuild plan MODEL --json`")
    if image is None and parse_image_source(target).kind != "name":
        raise InputError(f"{target} is a local image, which no cluster can pull",
                         hint="push it (`mbuild push`, which prints the digest) and give --image REPO@sha256:...")
    pullable = f"{split_image(target)[0]}@{found.digest}" if found.digest else target
    return _checked_plan(label, target), image or pullable


def _plan_and_image(source: str, image: str | None) -> tuple[PlanRecord, str | None, float | None]:
    """The plan, the image as given or by the digest the build or registry knows, and the load time the build
    measured."""
    path = Path(source)
    if not path.exists():
        if not source.startswith(("/", "./", "../", "~")):
            plan, pullable = _from_image(source, image)
            return plan, pullable, None
        raise InputError(f"{source} does not exist", hint="give a build directory, a plan file or an image")
    try:
        plan = _checked_plan((path / PLAN_FILE if path.is_dir() else path).read_text(errors="replace"), source)
    except OSError as exc:
        raise InputError(f"{source} is not a build directory or a plan file ({exc.strerror})",
                         hint="give the folder `mbuild package` wrote, or save `mbuild plan MODEL --json`") from exc
    if not path.is_dir():
        return plan, image, None
    record = read_record(path)
    digest = f"{split_image(record.tag)[0]}@{record.digest}" if record is not None and record.digest else None
    return plan, digest, _measured_load(path)


def load_spec(source: str, image: str | None = None, name: str | None = None,
              namespace: str | None = None) -> DeploySpec:
    plan, built, load_seconds = _plan_and_image(source, image)
    chosen = image or built or plan.tag
    parse_ref(chosen)  # a malformed --image is an InputError here, not a manifest the cluster rejects
    requires = plan.requires
    return DeploySpec(
        name=dns_label(name or plan.tag.split(":")[0].rsplit("/", 1)[-1]),
        image=chosen, task=plan.task, profile=plan.profile.name, profile_id=plan.profile.id, model=plan.model.repo,
        memory_gib=max(1, math.ceil(requires.memory_gb / 1.073741824)),
        gpus=requires.gpus if requires.device == "gpu" else 0,
        compute_capabilities=requires.compute_capabilities, max_batch=plan.max_batch,
        version=split_image(plan.tag)[1] or "latest", namespace=namespace, load_seconds=load_seconds,
        extras=plan.extras)
