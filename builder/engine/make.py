"""Export, compile and validate: the code that decides what an engine is (so the engine cache keys it)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.engine.export_worker import run_export
from builder.engine.exported import ExportResult
from builder.optional import load_stage
from builder.planning.engine_options import ort_options
from builder.planning.plan import BuildPlan
from builder.progress import Reporter
from runtimes.bundle import EngineConfig
from runtimes.bundle.codec import write_contract
from runtimes.bundle.engine import ENGINE_FILE, OrtBuild
from runtimes.bundle.report import REPORT_FILE, DecoderReport, GateReport
from runtimes.kernels import LIBRARY_FILE


@dataclass(frozen=True)
class TaskStages:
    """Where each task's export and gate live (imported on demand: they need the export extra)."""

    export: str
    gate: str
    exporting: str
    validating: str
    export_tensorrt: str | None = None  # when TensorRT needs a graph of its own
    # The ONNX Runtime export writes the engine itself, quantized as it reads the checkpoint (an 8B model
    # never sits in memory whole); compiling then only moves it into place.
    export_is_engine: bool = False


TASKS = {
    "embedding": TaskStages("builder.engine.export_encoder:export_encoder", "builder.engine.validate_encoder",
                            "PyTorch -> ONNX with pooling", "engine vs sentence-transformers"),
    "rerank": TaskStages("builder.engine.export_reranker:export_reranker", "builder.engine.validate_reranker",
                         "PyTorch -> ONNX with the scoring head",
                         "engine vs sentence-transformers' CrossEncoder (a decoder's: its card's recipe)"),
    "text-generation": TaskStages("builder.engine.export_decoder:export_decoder", "builder.engine.validate_decoder",
                                  "checkpoint -> ONNX with an in-place KV cache", "engine vs transformers generate",
                                  "builder.engine.export_decoder:export_decoder_tensorrt", export_is_engine=True),
}


def _place(work: Path, engine_dir: Path) -> None:
    engine_dir.mkdir(parents=True)
    for name in ("model.onnx", "model.onnx.data", LIBRARY_FILE):
        if (work / name).is_file():
            (work / name).rename(engine_dir / name)


def _compile(plan: BuildPlan, work: Path, engine_dir: Path, exported: ExportResult, built: bool) -> EngineConfig:
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    if plan.profile.engine == "tensorrt":
        compiler = load_stage("builder.engine.compile_tensorrt", "compiling TensorRT engines")
        config: EngineConfig = compiler.compile_engines(plan, work / "model.onnx", engine_dir, exported)
        shutil.copy2(work / "tokenizer.json", engine_dir / "tokenizer.json")
        write_contract(engine_dir / ENGINE_FILE, config)
        return config
    level = ort_options(plan.profile.engine_options).graph_optimization
    if built:
        _place(work, engine_dir)
    else:
        compiler = load_stage("builder.engine.compile_ort", "compiling with ONNX Runtime")
        source = compiler.quantize(work / "model.onnx", work / f"model.{plan.profile.precision}.onnx",
                                   plan.profile, plan.task)
        compiler.optimize(source, engine_dir / "model.onnx", level)
    shutil.copy2(work / "tokenizer.json", engine_dir / "tokenizer.json")
    # A language model's KV cache, or an encoder's attention scores (which grow with the square of a sequence),
    # are what the profile's context bounds.
    exported = exported.capped(plan.profile.limits.context)
    config = exported.engine_config("onnxruntime", "model.onnx", plan.profile.precision, plan.batching,
                                    OrtBuild(level))
    write_contract(engine_dir / ENGINE_FILE, config)
    return config


def make_engine(plan: BuildPlan, snapshot: Path, work: Path, engine_dir: Path, build_dir: Path,
                 reporter: Reporter) -> GateReport:
    """Export, compile and validate; the engine folder ends with its gate report."""
    stages = TASKS[plan.task]
    tensorrt = plan.profile.engine == "tensorrt"
    where = stages.export_tensorrt if tensorrt and stages.export_tensorrt else stages.export
    built = stages.export_is_engine and not tensorrt
    with reporter.stage("export", f"{stages.exporting}, {plan.profile.precision}" if built else stages.exporting):
        if built:  # in a child process: the gate that follows runs the engine without PyTorch beside it
            exported = run_export(where, snapshot, work, plan.profile)
        else:
            module, _, function = where.partition(":")
            exported = getattr(load_stage(module, "exporting to ONNX"), function)(snapshot, work)
    doing = (f"TensorRT {plan.profile.precision} engines" if tensorrt
             else "ONNX Runtime: the exported graph is the engine" if built
             else f"ONNX Runtime {plan.profile.precision}: quantize and optimize")
    with reporter.stage("compile", doing):
        _compile(plan, work, engine_dir, exported, built)
    if built and ort_options(plan.profile.engine_options).quantization == "tiles" \
            and not (engine_dir / LIBRARY_FILE).is_file():  # the export fell back (export_decoder._with_kernels)
        reporter.note("mbuild's int8 kernel could not be built on this host (it needs g++ and, once, deb.debian.org "
                      "for ONNX Runtime's headers): this engine runs ONNX Runtime's MatMulNBits on the same blocks, "
                      "as fast at one stream, slower for speculative verify rows and batches")
    gate = load_stage(stages.gate, "validating against the PyTorch reference")
    with reporter.stage("validate", stages.validating):
        report: GateReport = gate.run_gate(snapshot, engine_dir, plan.profile.tolerance, build_dir / REPORT_FILE)
    if built and isinstance(report, DecoderReport) and ort_options(plan.profile.engine_options).kv_cache == "int8":
        quant = load_stage("builder.engine.kv_cache_quant", "an int8 KV cache")
        with reporter.stage("validate", "the same engine with an int8 KV cache, calibrated and gated"):
            report = quant.int8_cache_gate(snapshot, engine_dir, plan.profile.tolerance, build_dir / REPORT_FILE,
                                           report)
        if isinstance(report, DecoderReport) and report.int8_cache is not None:
            reporter.note(f"the int8 KV cache failed the gate (top-1 {report.int8_cache.top1_agreement:.3f}, max logit "
                          f"error {report.int8_cache.max_logit_error:.3f}): the engine keeps an fp32 cache in the "
                          "memory planned for the int8 one, a quarter of the tokens (MBUILD_KV_CACHE_MB raises it)")
    shutil.copy2(build_dir / REPORT_FILE, engine_dir / REPORT_FILE)
    return report
