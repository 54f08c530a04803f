"""`mbuild package`: resolve -> plan -> pull -> export -> compile -> validate -> context -> image."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from builder.build import context as context_stage
from builder.build import host_fit, reuse
from builder.build.build_dir import claim as build_dir_claim
from builder.build.draft import build_draft
from builder.build.lock import write_lock
from builder.build.plan_package import PackageOptions, plan_package
from builder.engine import cache as engine_cache
from builder.engine.expected_io import expected_export
from builder.engine.make import make_engine
from builder.engine.report import REPORT_FILE, GateReport, require_report
from builder.errors import BaseImageError, InputError, MbuildError, ValidationFailed
from builder.image import ImageBackend, ImageResult, choose_backend
from builder.image.push import PushResult, push, record_image
from builder.model.pull import pull
from builder.model.sources import parse_model_ref
from builder.oci.refs import parse_image_source
from builder.optional import load_stage
from builder.planning.plan import BuildPlan
from builder.planning.selection import NoProfile
from builder.progress import Reporter


@dataclass
class PackageResult:
    plan: BuildPlan
    build_dir: Path
    report: GateReport | None  # None with --plan-only
    image: ImageResult | None
    backend_note: str
    reused: bool = False
    pushed: PushResult | None = None
    timings: dict[str, float] = field(default_factory=dict)


def default_build_dir(plan: BuildPlan) -> Path:
    return Path("mbuild-builds") / f"{plan.image_name.rsplit('/', 1)[-1]}-{plan.version}"


def _write_plan_files(build_dir: Path, plan: BuildPlan) -> None:
    """What a build will be, before building it: the context's light files, and the TensorRT settings."""
    context_stage.render(build_dir, plan, None)
    if plan.engines:
        settings = load_stage("builder.engine.compile_tensorrt", "planning TensorRT engines")
        exported = expected_export(plan.facts)
        (build_dir / settings.SETTINGS_FILE).write_text(settings.settings_json(plan, exported))


def _build(opts: PackageOptions, plan: BuildPlan, build_dir: Path, reporter: Reporter) -> GateReport:
    """Download, export, compile, validate and assemble the context; returns the gate's report."""
    reuse.forget(build_dir)
    work, engine_dir = build_dir / "work", build_dir / "model"
    work.mkdir(parents=True, exist_ok=True)
    if plan.engines:  # what the GPU build will be, on disk even if this host cannot build it
        _write_plan_files(build_dir, plan)
    key = engine_cache.engine_key(plan)
    hit = engine_cache.cached(key)
    if hit is None:
        host_fit.check_memory(plan)
    with reporter.stage("download", f"{len(plan.model.files)} files of {plan.model.repo}"):
        snapshot = pull(plan.model, parse_model_ref(opts.model), opts.is_offline)
    if hit is None:
        host_fit.check_disk(plan, build_dir)
    if hit is not None and (cached_report := engine_cache.restore(hit, engine_dir, plan)) is not None:
        report = cached_report
        shutil.copy2(engine_dir / REPORT_FILE, build_dir / REPORT_FILE)
        reporter.skipped("engine", f"reused the validated engine {hit.name[:12]} from mbuild's cache: same model "
                                   "files, engine, precision and tools; no export, compile or validation")
    else:
        report = make_engine(plan, snapshot, work, engine_dir, build_dir, reporter)
        try:
            engine_cache.store(key, engine_dir)
        except OSError as exc:  # the build stands without the cache; only the next one is slower
            reporter.note(f"engine not cached: {exc}; point MBUILD_ENGINE_CACHE at a writable folder to reuse it")
    reporter.note(report.summary)
    if plan.draft is not None and opts.draft:
        build_draft(plan, opts.draft, opts.is_offline, work, engine_dir, reporter)
    with reporter.stage("context", "Dockerfile, runtime, packages"):
        write_lock(build_dir, plan, snapshot)
        context_stage.assemble(build_dir, plan, report)
    reuse.mark_finished(build_dir, plan.digest())
    return report


def _build_image(backend: ImageBackend, build_dir: Path, tag: str) -> ImageResult:
    """The backend's build; a failure leaves its reason in image-build.log, which the error names."""
    log = build_dir / "image-build.log"
    try:
        return backend.build(build_dir, tag, log)
    except MbuildError as exc:
        with log.open("a") as out:
            out.write(f"error: {exc.message}\n" + (f"hint: {exc.hint}\n" if exc.hint else ""))
        if str(log) not in (exc.hint or ""):
            exc.hint = f"{exc.hint}; log: {log}" if exc.hint else f"log: {log}"
        raise


def package(opts: PackageOptions, reporter: Reporter) -> PackageResult:
    plan = plan_package(opts, reporter, for_plan_only=opts.plan_only)
    build_dir = (opts.output or default_build_dir(plan)).resolve()
    build_dir_claim(build_dir, opts.force)
    if opts.plan_only:
        with reporter.stage("context", "plan only: Dockerfile, image spec, plan, TensorRT settings"):
            _write_plan_files(build_dir, plan)
        return PackageResult(plan, build_dir, None, None, "--plan-only: no model, engine or packages",
                             timings=dict(reporter.timings))
    # Before any download or export: a backend that cannot build here fails in seconds, not after the gate.
    backend, note = choose_backend(opts.backend, opts.image_format, opts.offline)
    if backend is not None and backend.name == "docker" and parse_image_source(plan.base_image).kind != "name":
        raise BaseImageError(f"docker cannot build FROM {plan.base_image}: it reads bases from registries only",
                             hint="use --backend oci, podman or buildah (they read oci:, oci-archive: and "
                                  "docker-archive: bases), or `docker load` the base and name it")
    if backend is not None:
        backend.check_base(plan.base_image, plan.profile.python_version)
    reused = reuse.finished_digest(build_dir) == plan.digest()
    if reused:
        reporter.skipped("build", f"reused {build_dir}: plan digest {plan.digest()[:12]} unchanged, "
                                  "no download, export, compile or validation")
        report = require_report(build_dir / REPORT_FILE)
    else:
        try:
            report = _build(opts, plan, build_dir, reporter)
        except ValidationFailed as exc:
            if opts.precision or opts.wanted_profile:  # what the user pinned stands or fails
                raise
            failed = opts.failed_precisions | {plan.profile.precision}
            reporter.note(f"{plan.profile.precision} failed its gate ({exc.message}); trying the next precision")
            try:
                return package(dataclasses.replace(opts, failed_precisions=failed), reporter)
            except NoProfile:
                raise exc from None
    image = None
    if backend is None:
        reporter.skipped("image", note)
    elif (existing := backend.existing(plan.tag, build_dir)) is not None and reused:
        image = existing
        reporter.skipped("image", f"reused {plan.tag} ({existing.image_id[:19]}): already built by {backend.name}")
    else:
        reporter.note(note)
        with reporter.stage("image", f"{backend.name} build {plan.tag}"):
            image = _build_image(backend, build_dir, plan.tag)
        record_image(build_dir, backend.name, plan.tag, image.image_id, image.digest)
    pushed = None
    if opts.push:
        if image is None:
            raise InputError("--push needs an image; this run stopped at the build context",
                             hint="choose an image backend: --backend docker|podman|buildah|oci")
        with reporter.stage("push", f"{plan.tag} -> {opts.push}"):
            pushed = push(str(build_dir), opts.push)
    return PackageResult(plan, build_dir, report, image, note, reused, pushed, dict(reporter.timings))
