"""`mbuild package`: resolve -> plan -> pull -> export -> compile -> validate -> context -> image."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import UnsupportedModel
from builder.hubcache import offline_requested
from builder.image import ImageResult, choose_backend
from builder.lock import write_lock
from builder.optional import load_stage
from builder.plan import BuildPlan, make_plan
from builder.profiles import load_profiles, select_profile
from builder.progress import Reporter
from builder.sources import parse_model_ref
from builder.stages import context as context_stage
from builder.stages.compile_ort import optimize
from builder.stages.facts import infer_task, read_config
from builder.stages.pull import pull, resolve
from builder.target import resolve_target
from runtimes.bundle import EngineConfig


@dataclass(frozen=True)
class PackageOptions:
    model: str
    gpu: str | None = "cpu"
    output: Path | None = None
    name: str | None = None
    version: str | None = None
    base_image: str | None = None
    backend: str = "auto"
    offline: bool = False


@dataclass
class PackageResult:
    plan: BuildPlan
    build_dir: Path
    report: dict[str, Any]
    image: ImageResult | None
    backend_note: str
    timings: dict[str, float] = field(default_factory=dict)


def default_build_dir(plan: BuildPlan) -> Path:
    return Path("mbuild-builds") / f"{plan.image_name.rsplit('/', 1)[-1]}-{plan.version}"


def plan_package(opts: PackageOptions, reporter: Reporter) -> BuildPlan:
    spec = parse_model_ref(opts.model)
    offline = opts.offline or offline_requested()
    target = resolve_target(opts.gpu)
    with reporter.stage("resolve", f"{spec.display()}{' (offline)' if offline else ''}"):
        ref = resolve(spec, offline)
        task = infer_task(ref, read_config(ref, spec, offline))
    profile = select_profile(load_profiles(), target, task)
    plan = make_plan(ref, task, target, profile, image_name=opts.name, version=opts.version,
                     base_image=opts.base_image)
    reporter.note(f"model {ref.repo} @ {ref.sha[:12]} ({task}), profile {profile.name}, image {plan.tag}")
    return plan


def _compile(plan: BuildPlan, work: Path, engine_dir: Path, exported: dict[str, Any]) -> EngineConfig:
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    level = str(plan.profile.engine_options.get("graph_optimization", "extended"))
    optimize(work / "model.onnx", engine_dir / "model.onnx", level)
    shutil.copy2(work / "tokenizer.json", engine_dir / "tokenizer.json")
    options = {**exported.pop("options"), "max_batch": plan.profile.limits.max_batch, "graph_optimization": level}
    config = EngineConfig.from_dict({"engine": "onnxruntime", "model_file": "model.onnx", **exported,
                                     "options": options})
    (engine_dir / "engine.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return config


def package(opts: PackageOptions, reporter: Reporter) -> PackageResult:
    offline = opts.offline or offline_requested()
    plan = plan_package(opts, reporter)
    if plan.task != "embedding":
        raise UnsupportedModel(f"{plan.model.repo} is a {plan.task} model; this mbuild packages embedding models",
                               hint="try an embedding model such as all-minilm-l6-v2")
    build_dir = (opts.output or default_build_dir(plan)).resolve()
    work, engine_dir = build_dir / "work", build_dir / "model"
    work.mkdir(parents=True, exist_ok=True)
    spec = parse_model_ref(opts.model)

    with reporter.stage("download", f"{len(plan.model.files)} files of {plan.model.repo}"):
        snapshot = pull(plan.model, spec, offline)
    export = load_stage("builder.stages.export_encoder", "exporting to ONNX")
    with reporter.stage("export", "PyTorch -> ONNX with pooling"):
        exported = export.export_encoder(snapshot, work)
    with reporter.stage("compile", "ONNX Runtime graph optimization"):
        _compile(plan, work, engine_dir, exported)
    gate = load_stage("builder.stages.validate_encoder", "validating against the PyTorch reference")
    with reporter.stage("validate", "engine vs sentence-transformers"):
        report = gate.run_gate(snapshot, engine_dir, plan.profile.tolerance.min_cosine, build_dir / "report.json")
    shutil.copy2(build_dir / "report.json", engine_dir / "report.json")
    reporter.note(f"min cosine {report['min_cosine']:.7f} over {len(report['inputs'])} inputs "
                  f"(tolerance {plan.profile.tolerance.min_cosine})")
    with reporter.stage("context", "Dockerfile, runtime, wheels"):
        write_lock(build_dir, plan, snapshot)
        context_stage.assemble(build_dir, plan, report, context_stage.created_timestamp())

    backend, note = choose_backend(opts.backend)
    image = None
    if backend is None:
        reporter.skipped("image", note)
    else:
        with reporter.stage("image", f"{backend.name} build {plan.tag}"):
            image = backend.build(build_dir, plan.tag, build_dir / "image-build.log")
    return PackageResult(plan, build_dir, report, image, note, dict(reporter.timings))
