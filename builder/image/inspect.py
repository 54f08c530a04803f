"""`mbuild inspect`: what an image (or a build directory) is: labels, profile, model, validation, layers."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.engine.report import REPORT_FILE, read_report, summary_dict
from builder.errors import InputError
from builder.image.dockerfile_cli import ENGINES
from builder.image.oci import LAYOUT_DIR
from builder.image.push import read_record
from builder.image.spec import SPEC_FILE, ImageSpec
from builder.oci.base import local_layout, platform_manifest
from builder.oci.layout import Descriptor, Layout
from builder.oci.refs import DOCKER_HUB, parse_image_source, parse_ref
from builder.oci.registry import Registry
from builder.plan_record import PLAN_FILE, PlanRecord
from runtimes.bundle.codec import ContractError


@dataclass
class Inspection:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    layers: list[tuple[str, int]] = field(default_factory=list)  # (what made it, bytes)
    validation: dict[str, Any] = field(default_factory=dict)
    digest: str | None = None
    image_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "labels": self.labels, "digest": self.digest, "image_id": self.image_id,
                "validation": self.validation, "layers": [{"created_by": w, "bytes": b} for w, b in self.layers]}


def _layer_history(config: dict[str, Any], count: int) -> list[str]:
    """What made each layer; history is matched from the top, where mbuild's own layers are."""
    made = [str(h.get("created_by", "")) for h in config.get("history") or []
            if isinstance(h, dict) and not h.get("empty_layer")][-count:] if count else []
    made = [""] * (count - len(made)) + made
    return [m or "(no history recorded)" for m in made]


def _from_layout(layout: Layout, tag: str | None, name: str) -> Inspection:
    desc, manifest = layout.manifest(tag)
    config = layout.read_json(Descriptor.from_dict(manifest["config"], f"{name}: config").digest)
    made = _layer_history(config, len(manifest["layers"]))
    layers = [(what, int(layer["size"])) for what, layer in zip(made, manifest["layers"], strict=True)]
    return Inspection(name, dict(config.get("config", {}).get("Labels") or {}), layers, digest=desc.digest,
                      image_id=manifest["config"]["digest"])


def _from_engine(tool: str, image: str) -> Inspection | None:
    cli = ENGINES[tool]()
    info = cli.image_info(image)
    if info is None:
        return None
    layers = cli.history(image)
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    digests = info.get("RepoDigests") or []
    return Inspection(image, dict(labels), layers, digest=digests[0].split("@")[-1] if digests else None,
                      image_id=info.get("Id"))


def _from_registry(target: str) -> Inspection:
    """The manifest and config only: a model image's layers are gigabytes, and its labels say what it is."""
    ref = parse_ref(target)
    with Registry(ref) as registry, tempfile.TemporaryDirectory() as tmp:
        _, _, digest, manifest = platform_manifest(registry, ref, target)
        config_desc = Descriptor.from_dict(manifest.get("config"), f"manifest of {target}")
        registry.get_blob(config_desc.digest, Path(tmp) / "config.json")  # checked against its digest
        try:
            config = json.loads((Path(tmp) / "config.json").read_text())
            labels = dict((config.get("config") or {}).get("Labels") or {})
        except (ValueError, AttributeError, TypeError) as exc:
            raise InputError(f"{target}: its image config is not readable JSON ({exc})") from exc
    layers = manifest.get("layers") or []
    made = _layer_history(config, len(layers))
    return Inspection(target, labels, [(what, int(layer.get("size", 0))) for what, layer in zip(made, layers,
                                                                                               strict=True)],
                      digest=digest, image_id=config_desc.digest)


def _unbuilt(build_dir: Path) -> Inspection:
    """A build directory with no image yet: its plan's tag and the labels the image will carry."""
    try:
        tag = PlanRecord.parse((build_dir / PLAN_FILE).read_text(), PLAN_FILE).tag
        labels = ImageSpec.load(build_dir).labels
    except (OSError, ValueError, KeyError, TypeError, ContractError) as exc:
        raise InputError(f"{build_dir} is an unfinished build ({PLAN_FILE} or {SPEC_FILE} unreadable: {exc})",
                         hint="run `mbuild package` into it again") from exc
    return Inspection(f"{tag} (not built)", dict(labels))


def inspect_target(target: str) -> Inspection:
    """A build directory, oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE, or an engine's image."""
    path = Path(target)
    if path.is_dir() and (path / PLAN_FILE).is_file():
        record = read_record(path)
        if record is not None and record.backend == "oci":
            found = _from_layout(Layout(path / LAYOUT_DIR), record.tag, record.tag)
        elif record is not None:
            found = _from_engine(record.engine, record.tag) or Inspection(record.tag)
        else:
            found = _unbuilt(path)
        gate = read_report(path / REPORT_FILE)
        if gate is not None:
            found.validation = summary_dict(gate)
        return found
    parsed = parse_image_source(target)
    if parsed.kind in {"oci", "oci-archive", "docker-archive"}:
        return _from_layout(*local_layout(parsed), target)
    found_image: Inspection | None = None
    for tool in ENGINES:
        found_image = found_image or _from_engine(tool, target)
    if found_image is None and parsed.kind == "name" and parse_ref(target).registry != DOCKER_HUB:
        found_image = _from_registry(target)  # a registry named in the reference (Docker Hub is not reachable)
    if found_image is None:
        raise InputError(f"{target!r} is neither a build directory nor an image docker or podman holds",
                         hint="give a folder `mbuild package` wrote, oci:DIR[:TAG], oci-archive:FILE, "
                              "docker-archive:FILE, an image name, or REGISTRY/NAME[:TAG|@DIGEST]")
    validation = found_image.labels.get("dev.mbuild.validation")
    if validation:
        found_image.validation = {"label": validation}
    return found_image
