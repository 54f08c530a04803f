"""Assemble the build context: runtime code, model bundle, wheels, requirements and Dockerfile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from builder import __version__
from builder.build.site import install_site, installed_packages
from builder.engine.report import GateReport
from builder.image.dockerfile import render_dockerfile
from builder.image.spec import SPEC_FILE, ImageSpec, default_env, source_date_epoch, timestamp
from builder.model.ref import ModelRef
from builder.plan_record import PLAN_FILE
from builder.planning.plan import DEPLOY_LABEL, BuildPlan
from builder.resources import runtimes_dir
from runtimes.bundle.codec import write_contract
from runtimes.bundle.metadata import METADATA_FILE, BundleMetadata, ModelInfo, ProfileInfo

# Only what the Dockerfile copies goes to the engine: the export's work files and logs stay out.
DOCKERIGNORE = "*\n!site\n!app\n!model\n!mbuild.lock\n!bom.json\n!Dockerfile\n"


def bundle_metadata(plan: BuildPlan) -> BundleMetadata:
    """metadata.json beside the engine: what /v1/metadata reports and what the container checks at start."""
    return BundleMetadata(
        model=_info(plan.model),
        profile=ProfileInfo(id=plan.profile.id, name=plan.profile.name, engine=plan.profile.engine,
                            precision=plan.profile.precision, mode=plan.profile.mode),
        image=plan.tag, plan_digest=plan.digest(), versions=dict(plan.tools), requires=plan.requires(),
        draft=_info(plan.draft.model) if plan.draft else None)


def _info(ref: ModelRef) -> ModelInfo:
    return ModelInfo(repo=ref.repo, revision=ref.revision, sha=ref.sha, alias=ref.alias)


def bill_of_materials(plan: BuildPlan, site: Path) -> dict[str, Any]:
    """What the image is made of: base, Python packages (the image's pip freeze), engine, tools."""
    return {
        "image": plan.tag,
        "base_image": plan.base_image,
        "python": plan.profile.python_version,
        "python_packages": installed_packages(site),
        "engine": {"name": plan.profile.engine, "profile": plan.profile.name, "precision": plan.profile.precision},
        "model": {"repo": plan.model.repo, "sha": plan.model.sha},
        **({"draft_model": {"repo": plan.draft.model.repo, "sha": plan.draft.model.sha}} if plan.draft else {}),
        "build_tools": dict(plan.tools),
    }


def source_url(ref: ModelRef) -> str:
    return str(ref.local_path) if ref.local_path else f"https://huggingface.co/{ref.repo}"


def image_labels(plan: BuildPlan, report: GateReport | None, created: str) -> dict[str, str]:
    labels = {
        "org.opencontainers.image.title": plan.image_name,
        "org.opencontainers.image.version": plan.version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": source_url(plan.model),
        "org.opencontainers.image.description": f"{plan.model.repo} served by mbuild ({plan.profile.name})",
        "dev.mbuild.model.id": plan.model.repo,
        "dev.mbuild.model.revision": plan.model.sha or plan.model.revision,
        "dev.mbuild.profile": plan.profile.name,
        "dev.mbuild.profile.id": plan.profile.id,
        "dev.mbuild.engine": plan.profile.engine,
        "dev.mbuild.precision": plan.profile.precision,
        "dev.mbuild.plan.digest": plan.digest(),
        "dev.mbuild.version": __version__,
        DEPLOY_LABEL: json.dumps(plan.record().to_dict(), sort_keys=True, separators=(",", ":")),
    }
    if report is not None and report.label:
        labels["dev.mbuild.validation"] = report.label
    if plan.engines:
        labels["dev.mbuild.compute-capability"] = ",".join(e.compute_capability for e in plan.engines)
    return labels


def render(build_dir: Path, plan: BuildPlan, report: GateReport | None) -> ImageSpec:
    """The light part of the context, known from the plan alone: spec, Dockerfile, plan, requirements."""
    build_dir.mkdir(parents=True, exist_ok=True)
    created = timestamp(source_date_epoch())
    spec = ImageSpec(base_image=plan.base_image, labels=image_labels(plan, report, created),
                     model_id=plan.model.repo, mbuild_version=__version__, created=created,
                     env=default_env(device=plan.profile.device))
    (build_dir / SPEC_FILE).write_text(spec.to_json())
    (build_dir / "Dockerfile").write_text(render_dockerfile(spec))
    (build_dir / ".dockerignore").write_text(DOCKERIGNORE)
    (build_dir / PLAN_FILE).write_text(json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n")
    (build_dir / "requirements.txt").write_text("\n".join(plan.runtime_requirements) + "\n")
    return spec


def assemble(build_dir: Path, plan: BuildPlan, report: GateReport) -> Path:
    """Write everything `docker build` needs into build_dir; the model/ folder is already there."""
    app = build_dir / "app" / "runtimes"
    if app.exists():
        shutil.rmtree(app)
    shutil.copytree(runtimes_dir(), app, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    write_contract(build_dir / "model" / METADATA_FILE, bundle_metadata(plan))
    render(build_dir, plan, report)
    site = install_site(list(plan.runtime_requirements), plan.profile.python_version, build_dir / "site",
                        list(plan.runtime_no_deps))
    (build_dir / "bom.json").write_text(json.dumps(bill_of_materials(plan, site), indent=2) + "\n")
    return build_dir
