"""Planning a package run: resolve the model, judge every profile per target, freeze the BuildPlan.

Nothing here downloads weights or writes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.build.draft import plan_draft
from builder.errors import InputError
from builder.model.catalog import ModelFacts
from builder.model.facts import model_facts
from builder.model.families import takes_fast_lane
from builder.model.hubcache import offline_requested
from builder.model.pull import resolve, resolve_or_defer
from builder.model.ref import ModelRef
from builder.model.sources import parse_model_ref
from builder.oci.media import Format
from builder.planning.plan import BuildPlan, EngineTarget, make_plan
from builder.planning.profiles import Profile, load_profiles
from builder.planning.selection import Selection, require_selection, select
from builder.planning.target import Target, resolve_targets
from builder.progress import Reporter
from builder.settings import host_settings


@dataclass(frozen=True)
class PackageOptions:
    model: str
    gpu: str | None = None
    output: Path | None = None
    name: str | None = None
    version: str | None = None
    base_image: str | None = None
    backend: str = "auto"
    offline: bool = False
    profile: str | None = None
    precision: str | None = None
    mode: str | None = None
    image_format: Format = "oci"
    push: str | None = None
    plan_only: bool = False
    draft: str | None = None  # a speculative-decoding draft model built beside the target (builder/build/draft.py)
    extras: tuple[str, ...] = ()  # optional parts of the image (builder/versions.EXTRAS)
    force: bool = False  # build into a non-empty folder mbuild did not make (never deleting its files)
    failed_precisions: frozenset[str] = frozenset()  # failed the gate on this model: choose another
    model_impl: str = "auto"  # a language model's export: auto, fast-lane or generic (engine_options.model_impl)

    @property
    def is_offline(self) -> bool:
        return self.offline or offline_requested()

    @property
    def wanted_profile(self) -> str | None:
        return self.profile or host_settings().profile


@dataclass(frozen=True)
class Planning:
    """What planning found before choosing: the pinned model, its facts, the target, every verdict."""

    ref: ModelRef
    facts: ModelFacts
    target: Target
    selection: Selection


def planning_for(opts: PackageOptions, *, for_plan_only: bool = False) -> Planning:
    """Resolve, read facts, detect the target and judge every profile, without downloading weights."""
    return planning_all(opts, for_plan_only=for_plan_only)[0]


def planning_all(opts: PackageOptions, *, for_plan_only: bool = False) -> list[Planning]:
    """One Planning per target (`--gpu h100,l40s` gives two), sharing the resolved model."""
    spec = parse_model_ref(opts.model)
    targets = resolve_targets(opts.gpu)
    # A folder's config.json is read before its files are chosen: a family mbuild does not build is refused as
    # that, not as a folder without weights.
    early = model_facts(spec, None, opts.is_offline) if spec.local_path is not None else None
    ref = resolve_or_defer(spec, opts.is_offline) if for_plan_only else resolve(spec, opts.is_offline)
    facts = early or model_facts(spec, ref, opts.is_offline)
    profiles = load_profiles()
    return [Planning(ref, facts, target, select(profiles, target, facts, profile=opts.wanted_profile,
                                                 precision=opts.precision, mode=opts.mode,
                                                 failed=opts.failed_precisions)) for target in targets]


def with_model_impl(profile: Profile, impl: str, facts: ModelFacts) -> Profile:
    """The chosen profile with `--model-impl` in its engine options (so in its id, the plan's digest and the engine
    cache's key), or the refusal that says why that export cannot build this model here."""
    if impl == "auto":
        return profile
    if facts.task != "text-generation":
        raise InputError(f"--model-impl chooses a language model's export; this is a {facts.task} model",
                         hint="leave --model-impl out")
    if profile.engine != "onnxruntime":
        raise InputError(f"--model-impl {impl} chooses between ONNX Runtime's exports; TensorRT engines are built "
                         "from the fast lane's graph only", hint="leave --model-impl out, or build for --gpu cpu")
    kind = facts.wrapper or facts.family
    if takes_fast_lane(kind, impl) == takes_fast_lane(kind):  # the fast lane asked of a type it lacks: refused
        return profile  # the path auto takes: the same engine, the same digest
    return Profile.model_validate({**profile.model_dump(), "engine_options": {**profile.engine_options,
                                                                              "model_impl": impl}})


def plan_package(opts: PackageOptions, reporter: Reporter, *, for_plan_only: bool = False) -> BuildPlan:
    spec = parse_model_ref(opts.model)
    with reporter.stage("resolve", f"{spec.display()}{' (offline)' if opts.is_offline else ''}"):
        found_all = planning_all(opts, for_plan_only=for_plan_only)
    found = found_all[0]
    ref, facts = found.ref, found.facts
    asked = ", ".join(f"--{k} {v}" for k, v in (("precision", opts.precision), ("mode", opts.mode)) if v)
    chosen = [require_selection(f.selection, f.target, ref.repo, asked) for f in found_all]
    profile = with_model_impl(chosen[0].profile, opts.model_impl, facts)
    engines = tuple(EngineTarget(f.target.gpu.model, f.target.gpu.compute_capability, c.profile)
                    for f, c in zip(found_all, chosen, strict=True) if f.target.gpu is not None)
    if "dynamo" in opts.extras and facts.task != "text-generation":
        raise InputError(f"--with dynamo serves language models; {ref.repo} is a {facts.task} model",
                         hint="leave --with dynamo out for it")
    draft = None
    if opts.draft is not None:  # "" too: refused, never taken for no draft
        with reporter.stage("resolve", f"draft model {opts.draft}"):
            draft = plan_draft(opts.draft, facts, profile, opts.is_offline, for_plan_only=for_plan_only)
    plan = make_plan(ref, facts, found.target, profile, chosen[0].need, found.selection.why,
                     image_name=opts.name, version=opts.version, base_image=opts.base_image, engines=engines,
                     draft=draft, extras=opts.extras)
    pinned = f"@ {ref.sha[:12]}" if ref.sha else f"@ {ref.revision} (unpinned)"
    drafting = f"; draft {draft.model.repo}" if draft else ""
    reporter.note(f"model {ref.repo} {pinned} ({facts.task}){drafting}; profile {profile.name}; "
                  f"image {plan.tag}")
    return plan


