"""The BuildPlan: every input of a build, frozen, with a digest that versions the result.

Pure: no downloads, no writes. Same inputs, same digest, same image tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from builder.errors import InputError
from builder.hashing import sha256_json, tree_digest
from builder.model.catalog import ModelFacts, Task
from builder.model.families import export_path
from builder.model.ref import ModelRef
from builder.plan_record import PLAN_FORMAT, PlannedContent, PlannedLimits, PlannedModel, PlannedProfile, PlanRecord
from builder.planning.engine_options import model_impl
from builder.planning.memory import MemoryNeed, kv_pool_bytes
from builder.planning.profiles import Profile
from builder.planning.target import Target
from builder.resources import resource_dir, runtimes_dir
from builder.versions import extra_requirements, runtime_requirements, tool_versions
from runtimes.bundle.engine import Batching
from runtimes.bundle.metadata import Requirements


@dataclass(frozen=True)
class EngineTarget:
    """One compiled engine of a GPU build: for this GPU model and compute capability, with this profile."""

    gpu_model: str
    compute_capability: str
    profile: Profile


@dataclass(frozen=True)
class DraftPlan:
    """A speculative-decoding draft model built beside the target (builder/build/draft.py), with its own need."""

    model: ModelRef
    facts: ModelFacts
    need: MemoryNeed


_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_NAME = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
DEPLOY_LABEL = "dev.mbuild.deploy"  # the image's copy of deploy_summary()


@dataclass(frozen=True)
class BuildPlan:
    model: ModelRef
    facts: ModelFacts
    target: Target
    profile: Profile
    need: MemoryNeed
    why: tuple[str, ...]
    image_name: str
    explicit_version: str | None
    base_image: str
    runtime_requirements: tuple[str, ...]
    runtime_code: str
    templates: str
    tools: tuple[tuple[str, str], ...]
    engines: tuple[EngineTarget, ...] = ()  # GPU builds: one per target GPU model; empty on CPUs
    draft: DraftPlan | None = None  # need is then the target's with the draft's (MemoryNeed.with_draft)
    extras: tuple[str, ...] = ()  # optional parts of the image (builder/versions.EXTRAS), e.g. ("dynamo",)
    runtime_no_deps: tuple[str, ...] = ()  # the extras' lines pip installs again without dependencies

    @property
    def task(self) -> Task:
        return self.facts.task

    @property
    def export_path(self) -> str | None:
        """Which export builds a language model, and why (None for other tasks): what plan and package say."""
        if not self.facts.family or self.task != "text-generation":
            return None
        return export_path(self.facts.wrapper or self.facts.family,
                           model_impl(self.profile.engine, self.profile.engine_options))

    def inputs(self) -> dict[str, Any]:
        """Everything that decides the build's output; the digest is taken over this.

        The target is not here: it only chose the profile, and the profile (which names its
        hardware) is. Two hosts that pick the same profile make the same build. A draft model is, when there is
        one (and only then, so a plan without one keeps its digest)."""
        return {
            "model": _model_inputs(self.model),
            **({"draft": _model_inputs(self.draft.model)} if self.draft else {}),
            "task": self.task,
            "profile": {"id": self.profile.id, "name": self.profile.name},
            "engines": [{"compute_capability": e.compute_capability, "profile": e.profile.id} for e in self.engines],
            "image": {"name": self.image_name, "version": self.explicit_version},
            "base_image": self.base_image,
            "runtime": {"requirements": list(self.runtime_requirements), "code": self.runtime_code,
                        "python": self.profile.python_version,
                        # Only when there are some, so a plan without extras keeps its digest.
                        **({"extras": list(self.extras), "no_deps": list(self.runtime_no_deps)}
                           if self.extras else {})},
            "templates": self.templates,
            "tools": dict(self.tools),
        }

    def digest(self) -> str:
        return sha256_json(self.inputs())

    @property
    def version(self) -> str:
        return self.explicit_version or f"sha-{self.digest()[:12]}"

    @property
    def tag(self) -> str:
        return f"{self.image_name}:{self.version}"

    def requires(self) -> Requirements:
        """What the serving host must have; the container checks it at start."""
        return Requirements(device=self.profile.device, cpu_flags=tuple(self.profile.match.cpu_flags),
                            memory_gb=self.need.rounded_gb, python=self.profile.python_version,
                            gpus=self.profile.tp if self.engines else 0,
                            compute_capabilities=tuple(e.compute_capability for e in self.engines),
                            gpu_models=tuple(e.gpu_model for e in self.engines))

    @property
    def batching(self) -> Batching:
        """engine.json's batching: the profile's limits, and the KV pool's planned bytes."""
        return Batching(self.profile.limits.max_batch, self.profile.limits.max_batch_delay_ms,
                        kv_pool_bytes(self.facts, self.profile))

    def record(self) -> PlanRecord:
        """What `mbuild deploy` reads of a plan, at the same paths as in to_dict(): the image carries it as a
        label, so an image alone can be deployed."""
        return PlanRecord(tag=self.tag, task=self.task, model=PlannedModel(self.model.repo),
                          profile=PlannedProfile(self.profile.id, self.profile.name,
                                                 PlannedContent(PlannedLimits(self.profile.limits.max_batch))),
                          requires=self.requires(), extras=self.extras)

    def to_dict(self) -> dict[str, Any]:
        """plan.json (and `mbuild plan --json`)."""
        inputs = self.inputs()
        return {
            "format": PLAN_FORMAT,
            "digest": self.digest(),
            "tag": self.tag,
            **inputs,
            "model": {**inputs["model"], "revision": self.model.revision, "alias": self.model.alias,
                      "resolved": self.model.sha is not None, "note": self.model.note},
            **({"draft": {**inputs["draft"], "facts": self.draft.facts.model_dump(mode="json"),
                          "memory": self.draft.need.as_dict()}} if self.draft else {}),
            "facts": self.facts.model_dump(mode="json"),
            "target": self.target.as_dict(),
            "profile": {"id": self.profile.id, "name": self.profile.name, "why": list(self.why),
                        "content": self.profile.model_dump(mode="json")},
            "memory": self.need.as_dict(),
            "requires": self.requires().to_dict(),
            **({"extras": list(self.extras)} if self.extras else {}),  # where the record has them
        }


def _model_inputs(ref: ModelRef) -> dict[str, Any]:
    return {"repo": ref.repo, "revision": ref.revision if ref.sha is None else None, "sha": ref.sha,
            "files": list(ref.files)}


def default_image_name(ref: ModelRef) -> str:
    base = ref.alias or ref.repo.rsplit("/", 1)[-1]
    slug = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._") or "model"
    return f"mbuild/{slug}"


def check_image_name(name: str) -> str:
    if not _IMAGE_NAME.fullmatch(name) or len(name) > 255:
        raise InputError(f"image name {name!r} is not a valid repository name",
                         hint="use lowercase letters, digits, '.', '_', '-' and '/' (e.g. myorg/minilm)")
    return name


def check_version(version: str) -> str:
    if not _TAG.fullmatch(version):
        raise InputError(f"version {version!r} is not a valid image tag",
                         hint="use up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'")
    return version


def make_plan(ref: ModelRef, facts: ModelFacts, target: Target, profile: Profile, need: MemoryNeed,
              why: tuple[str, ...], *, image_name: str | None, version: str | None,
              base_image: str | None, engines: tuple[EngineTarget, ...] = (),
              draft: DraftPlan | None = None, extras: tuple[str, ...] = ()) -> BuildPlan:
    resolved, no_deps = extra_requirements(extras)
    return BuildPlan(
        model=ref, facts=facts, target=target, profile=profile, need=need.with_draft(draft.need) if draft else need,
        why=why,
        image_name=check_image_name(image_name) if image_name else default_image_name(ref),
        explicit_version=check_version(version) if version is not None else None,
        base_image=base_image or profile.base_image,
        runtime_requirements=(*runtime_requirements(profile.device), *resolved),
        runtime_code=tree_digest(runtimes_dir()),
        # The image's templates only: the Helm chart's (templates/helm) go into no image.
        templates=tree_digest(resource_dir("templates"), exclude=("__pycache__", "helm")),
        tools=tuple(sorted(tool_versions().items())),
        engines=engines,
        draft=draft,
        extras=extras,
        runtime_no_deps=tuple(no_deps),
    )
