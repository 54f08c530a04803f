"""`mbuild package`: resolve -> plan -> pull -> export -> compile -> validate -> context -> image."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import reuse
from builder.catalog import ModelFacts
from builder.errors import InputError, ToolMissing
from builder.hubcache import offline_requested
from builder.image import ImageResult, choose_backend
from builder.lock import write_lock
from builder.oci.media import Format
from builder.optional import load_stage
from builder.plan import BuildPlan, make_plan
from builder.profiles import load_profiles
from builder.progress import Reporter
from builder.push import PushResult, push, record_image
from builder.selection import Selection, require_selection, select
from builder.sources import parse_model_ref
from builder.stages import context as context_stage
from builder.stages.facts import model_facts
from builder.stages.pull import ModelRef, pull, resolve, resolve_or_defer
from builder.target import Target, resolve_target
from runtimes.bundle import EngineConfig


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

    @property
    def is_offline(self) -> bool:
        return self.offline or offline_requested()

    @property
    def wanted_profile(self) -> str | None:
        return self.profile or os.environ.get("MBUILD_PROFILE") or None


@dataclass
class PackageResult:
    plan: BuildPlan
    build_dir: Path
    report: dict[str, Any]
    image: ImageResult | None
    backend_note: str
    reused: bool = False
    pushed: PushResult | None = None
    timings: dict[str, float] = field(default_factory=dict)


def default_build_dir(plan: BuildPlan) -> Path:
    return Path("mbuild-builds") / f"{plan.image_name.rsplit('/', 1)[-1]}-{plan.version}"


@dataclass(frozen=True)
class Planning:
    """What planning found before choosing: the pinned model, its facts, the target, every verdict."""

    ref: ModelRef
    facts: ModelFacts
    target: Target
    selection: Selection


def planning_for(opts: PackageOptions, *, for_plan_only: bool = False) -> Planning:
    """Resolve, read facts, detect the target and judge every profile, without downloading weights."""
    spec = parse_model_ref(opts.model)
    target = resolve_target(opts.gpu)
    ref = resolve_or_defer(spec, opts.is_offline) if for_plan_only else resolve(spec, opts.is_offline)
    facts = model_facts(ref, spec, opts.is_offline)
    selection = select(load_profiles(), target, facts, profile=opts.wanted_profile, precision=opts.precision,
                       mode=opts.mode)
    return Planning(ref, facts, target, selection)


def plan_package(opts: PackageOptions, reporter: Reporter, *, for_plan_only: bool = False) -> BuildPlan:
    spec = parse_model_ref(opts.model)
    with reporter.stage("resolve", f"{spec.display()}{' (offline)' if opts.is_offline else ''}"):
        found = planning_for(opts, for_plan_only=for_plan_only)
    ref, facts = found.ref, found.facts
    asked = ", ".join(f"--{k} {v}" for k, v in (("precision", opts.precision), ("mode", opts.mode)) if v)
    chosen = require_selection(found.selection, found.target, ref.repo, asked)
    plan = make_plan(ref, facts, found.target, chosen.profile, chosen.need, found.selection.why,
                     image_name=opts.name, version=opts.version, base_image=opts.base_image)
    pinned = f"@ {ref.sha[:12]}" if ref.sha else f"@ {ref.revision} (unpinned)"
    reporter.note(f"model {ref.repo} {pinned} ({facts.task}); profile {chosen.profile.name}; image {plan.tag}")
    return plan


@dataclass(frozen=True)
class TaskStages:
    """Where each task's export and gate live (imported on demand: they need the export extra)."""

    export: str
    gate: str
    exporting: str
    validating: str


TASKS = {
    "embedding": TaskStages("builder.stages.export_encoder:export_encoder", "builder.stages.validate_encoder",
                            "PyTorch -> ONNX with pooling", "engine vs sentence-transformers"),
    "text-generation": TaskStages("builder.stages.export_decoder:export_decoder", "builder.stages.validate_decoder",
                                  "PyTorch -> ONNX with a KV cache", "engine vs transformers generate"),
}


def _compile(plan: BuildPlan, work: Path, engine_dir: Path, exported: dict[str, Any]) -> EngineConfig:
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    level = str(plan.profile.engine_options.get("graph_optimization", "extended"))
    compiler = load_stage("builder.stages.compile_ort", "compiling with ONNX Runtime")
    source = compiler.quantize(work / "model.onnx", work / f"model.{plan.profile.precision}.onnx", plan.profile,
                               plan.task)
    compiler.optimize(source, engine_dir / "model.onnx", level)
    shutil.copy2(work / "tokenizer.json", engine_dir / "tokenizer.json")
    options = {**exported.pop("options"), "max_batch": plan.profile.limits.max_batch, "graph_optimization": level,
               "precision": plan.profile.precision}
    if plan.task == "text-generation" and plan.profile.limits.context:
        # The served context is what the profile reserved KV cache for, not the model's longest.
        exported["max_seq_length"] = min(int(exported["max_seq_length"]), plan.profile.limits.context)
    config = EngineConfig.from_dict({"engine": "onnxruntime", "model_file": "model.onnx", **exported,
                                     "options": options})
    (engine_dir / "engine.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return config


def _check_buildable(plan: BuildPlan) -> None:
    if plan.profile.engine != "onnxruntime":
        raise ToolMissing(f"profile {plan.profile.name} needs a {plan.profile.engine} compile stage that this host "
                          "cannot run", hint="package for the CPU (--gpu cpu), or build on a host with TensorRT")


def _build(opts: PackageOptions, plan: BuildPlan, build_dir: Path, reporter: Reporter) -> dict[str, Any]:
    """Download, export, compile, validate and assemble the context; returns the gate's report."""
    reuse.forget(build_dir)
    work, engine_dir = build_dir / "work", build_dir / "model"
    work.mkdir(parents=True, exist_ok=True)
    stages = TASKS[plan.task]
    with reporter.stage("download", f"{len(plan.model.files)} files of {plan.model.repo}"):
        snapshot = pull(plan.model, parse_model_ref(opts.model), opts.is_offline)
    module, _, function = stages.export.partition(":")
    export = getattr(load_stage(module, "exporting to ONNX"), function)
    with reporter.stage("export", stages.exporting):
        exported = export(snapshot, work)
    with reporter.stage("compile", f"ONNX Runtime {plan.profile.precision}: quantize and optimize"):
        _compile(plan, work, engine_dir, exported)
    gate = load_stage(stages.gate, "validating against the PyTorch reference")
    with reporter.stage("validate", stages.validating):
        report: dict[str, Any] = gate.run_gate(snapshot, engine_dir, plan.profile.tolerance,
                                               build_dir / "report.json")
    shutil.copy2(build_dir / "report.json", engine_dir / "report.json")
    reporter.note(report["summary"])
    with reporter.stage("context", "Dockerfile, runtime, packages"):
        write_lock(build_dir, plan, snapshot)
        context_stage.assemble(build_dir, plan, report)
    reuse.mark_finished(build_dir, plan.digest())
    return report


def package(opts: PackageOptions, reporter: Reporter) -> PackageResult:
    plan = plan_package(opts, reporter)
    _check_buildable(plan)
    build_dir = (opts.output or default_build_dir(plan)).resolve()
    reused = reuse.finished_digest(build_dir) == plan.digest()
    if reused:
        reporter.skipped("build", f"reused {build_dir}: plan digest {plan.digest()[:12]} unchanged, "
                                  "no download, export, compile or validation")
        report: dict[str, Any] = json.loads((build_dir / "report.json").read_text())
    else:
        report = _build(opts, plan, build_dir, reporter)
    backend, note = choose_backend(opts.backend, opts.image_format)
    image = None
    if backend is None:
        reporter.skipped("image", note)
    elif (existing := backend.existing(plan.tag, build_dir)) is not None and reused:
        image = existing
        reporter.skipped("image", f"reused {plan.tag} ({existing.image_id[:19]}): already built by {backend.name}")
    else:
        reporter.note(note)
        with reporter.stage("image", f"{backend.name} build {plan.tag}"):
            image = backend.build(build_dir, plan.tag, build_dir / "image-build.log")
        record_image(build_dir, backend.name, plan.tag, image.image_id, image.digest)
    pushed = None
    if opts.push:
        if image is None:
            raise InputError("--push needs an image; this run stopped at the build context",
                             hint="choose an image backend: --backend docker|podman|buildah|oci")
        with reporter.stage("push", f"{plan.tag} -> {opts.push}"):
            pushed = push(str(build_dir), opts.push)
    return PackageResult(plan, build_dir, report, image, note, reused, pushed, dict(reporter.timings))
