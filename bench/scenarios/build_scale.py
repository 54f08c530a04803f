"""How a build's memory grows with the model: peak RSS, wall time and output size of `mbuild package`.

For random bf16 Llamas of three published shapes, beside llama.cpp's converter on the same files.

Models (bench/lib/llm_models.py): random bf16 safetensors written once to ~/.cache/mbuild-bench/scale/<shape>, one
shard at a time (a shard's tensors made for it, never the whole model), sharded as the Hub's checkpoints are
(at most 5 GB a shard, the index beside them when there are several):
  100m  the ~100M Llama of the llama.cpp comparison (12 layers, hidden 640), Llama SPM vocabulary (32000)
  1b    Llama-3.2-1B's shape (16 layers, hidden 2048, tied embeddings), Llama 3's BPE vocabulary (128256)
  8b    Llama-3.1-8B's shape (32 layers, hidden 4096, untied lm_head): model-0000N-of-00004.safetensors
Both vocabularies come from llama.cpp's vocab-only GGUFs; contexts are capped at 4096 (no rope scaling).
Arms, each run once (no repeats: a build of 8B takes long) as a subprocess, HF_HUB_OFFLINE=1:
  mbuild P      `python -m builder.cli package MODEL --backend none --gpu cpu --precision P --output OUT`,
                with an empty engine cache of its own (a cached engine would skip the export)
  llama.cpp T   `convert_hf_to_gguf.py MODEL --outtype T --outfile X` (llama.cpp vendored in llama-cpp-python
                0.3.36), T in q8_0, bf16, f32
The RSS of the whole process tree is summed every 0.1 s. mbuild prints a line on stderr as each stage ends; the
lines are stamped as they arrive, so the export stage is the samples from the line before "✓ export" to that
line. RSS counts the touched pages of memory-mapped files (shared libraries, a checkpoint or ONNX data a tool
maps), which the kernel can drop under pressure; "anonymous" is RSS less its file-backed and shared pages
(statm's resident - shared), what the build itself holds.
Outputs are measured with du (OUT: bundle and work files; OUT/model: the bundle's engine) and deleted. A shape
not run keeps its results from the previous JSON, arm by arm, so 8B can run on its own (`--shapes 8b`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import LlamaConfig

from bench.lib import llamacpp
from bench.lib.build_scale_report import plot, render
from bench.lib.build_scale_serve import serve_arm
from bench.lib.harness import OUT, machine, skipped, write
from bench.lib.llm_models import LLAMA3_1B, LLAMA3_8B, LLAMA_100M, make_llama_bpe, make_llama_spm, weight_shapes
from bench.lib.mbuild import MBUILD, source_hash
from bench.lib.mbuild import plan as mbuild_plan
from bench.lib.rss import Sampled, disk_bytes, run_sampled
from builder.errors import ValidationFailed

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "a build's peak memory, time and output against model size"

SCALE = llamacpp.CACHE / "scale"
MAX_SHARD = 5_000_000_000  # transformers' max_shard_size="5GB", what the Hub's Llama checkpoints were saved with
PRECISIONS = ("fp32", "int8", "int4")
GGUF_TYPES = ("q8_0", "bf16", "f32")
GATE_FAILED = ValidationFailed.exit_code  # the engine was built and gated, and missed its tolerance


@dataclass(frozen=True)
class Shape:
    key: str
    title: str
    config: dict[str, Any]
    make: Callable[..., Path]  # make_llama_spm or make_llama_bpe
    vocab: Path


SHAPES = {shape.key: shape for shape in (
    Shape("100m", "random ~100M Llama, SPM vocabulary (32000)", LLAMA_100M, make_llama_spm, llamacpp.SPM_VOCAB),
    Shape("1b", "random Llama-3.2-1B-shaped, Llama 3 BPE vocabulary (128256)", LLAMA3_1B, make_llama_bpe,
          llamacpp.BPE_VOCAB),
    Shape("8b", "random Llama-3.1-8B-shaped, Llama 3 BPE vocabulary (128256)", LLAMA3_8B, make_llama_bpe,
          llamacpp.BPE_VOCAB))}


def make_model(shape: Shape) -> Path:
    """The shape's checkpoint in the cache, written on first use."""
    llamacpp.ensure_source()
    folder = SCALE / shape.key
    if not (folder / "config.json").is_file():
        print(f"  writing the random bf16 {shape.key} checkpoint to {folder} (once)")
    return shape.make(folder, shape.config, shape.vocab, dtype=torch.bfloat16, shard_bytes=MAX_SHARD)


def _offline() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def _summary(run: Sampled, output: Path) -> dict[str, Any]:
    return {**run.summary(), "output_bytes": disk_bytes(output), "date": time.strftime("%Y-%m-%d %H:%M")}


def mbuild_arm(model: Path, precision: str, work: Path, serve: bool = False) -> dict[str, Any]:
    """One `mbuild package` under the sampler (and with `serve`, its engine served once: build_scale_serve.py);
    its output and engine cache are deleted after."""
    out, engines = work / f"mbuild-{precision}", work / "engines"
    for folder in (out, engines):
        shutil.rmtree(folder, ignore_errors=True)
    run = run_sampled([*MBUILD, "package", str(model), "--backend", "none", "--gpu", "cpu", "--precision",
                       precision, "--output", str(out)], {**_offline(), "MBUILD_ENGINE_CACHE": str(engines)})
    windows = run.windows()
    result = {**_summary(run, out), "model_bytes": disk_bytes(out / "model"), "mbuild_source": source_hash(),
              "stages": {name: took for name, _, took in run.stages()}, "peak_stage": run.peak_stage(),
              "stage_peak_rss": {name: peak for name, window in windows.items() if (peak := run.peak(*window)[0])}}
    if "export" in windows and run.peak(*windows["export"])[0]:  # a stage shorter than a sample has no peak
        result["export_peak_rss"], result["export_peak_anon"] = run.peak(*windows["export"])
    if run.rc == GATE_FAILED and "validate" in windows:  # built and gated: only the context stage is missing
        result["gate_failed"] = True
    if serve and (out / "model" / "engine.json").is_file():
        print(f"    serving the {precision} engine", flush=True)
        result["serve"] = serve_arm(out, _offline())
    for folder in (out, engines):
        shutil.rmtree(folder, ignore_errors=True)
    return result


def converter_arm(shape: Shape, model: Path, outtype: str, work: Path) -> dict[str, Any]:
    """llama.cpp's convert_hf_to_gguf.py under the sampler; the GGUF is deleted after."""
    if shape.vocab == llamacpp.SPM_VOCAB:
        llamacpp.spm_ready(model)
    out = work / f"{model.name}-{outtype}.gguf"
    out.unlink(missing_ok=True)
    run = run_sampled(llamacpp.convert_command(model, out, outtype), {**llamacpp.gguf_env(), "HF_HUB_OFFLINE": "1"})
    result = {**_summary(run, out), "llama_cpp_python": llamacpp.VERSION}
    out.unlink(missing_ok=True)
    return result


def predicted(model: Path, precision: str) -> dict[str, Any]:
    """The build memory `mbuild plan --json` predicts: its "build_memory" if it has one, else memory.build_gb
    (GB of RAM for export, compile and gate); None when the plan has neither or does not run."""
    plan = mbuild_plan(model, "--precision", precision)
    memory: dict[str, Any] = plan["memory"] if isinstance(plan.get("memory"), dict) else {}
    key = "build_memory" if "build_memory" in plan else "memory.build_gb" if "build_gb" in memory else None
    return {"predicted_build_memory": plan.get("build_memory", memory.get("build_gb")), "predicted_key": key,
            "plan_memory": memory or None}


def measure_shape(shape: Shape, precisions: list[str], gguf_types: list[str],
                  serve: tuple[str, ...] = ()) -> dict[str, Any]:
    model = make_model(shape)
    params = sum(s.numel() for s in weight_shapes(LlamaConfig.from_pretrained(model)).values())
    work = SCALE / "runs"
    work.mkdir(parents=True, exist_ok=True)
    arms: dict[str, Any] = {}
    for precision in precisions:
        print(f"  {shape.key}: mbuild {precision}", flush=True)
        arms[f"mbuild {precision}"] = {**mbuild_arm(model, precision, work, serve=precision in serve),
                                       **predicted(model, precision)}
        _log(arms[f"mbuild {precision}"])
    for outtype in gguf_types:
        print(f"  {shape.key}: llama.cpp convert_hf_to_gguf.py --outtype {outtype}", flush=True)
        arms[f"llama.cpp {outtype}"] = converter_arm(shape, model, outtype, work)
        _log(arms[f"llama.cpp {outtype}"])
    return {"title": shape.title, "params": params, "fp32_weight_bytes": params * 4,
            "checkpoint_bytes": disk_bytes(model),
            "checkpoint_files": sorted(file.name for file in model.glob("*.safetensors")),
            "machine": {**machine(), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
                        "cores_allowed": len(os.sched_getaffinity(0))}, "arms": arms}


def _log(arm: dict[str, Any]) -> None:
    export = f", export stage {arm['export_peak_rss'] / 2**30:.2f} GiB" if "export_peak_rss" in arm else ""
    status = "" if not arm["rc"] else f" FAILED (exit {arm['rc']}): {' | '.join(arm['tail'][-3:])}"
    stage = f" in {arm['peak_stage']}" if arm.get("peak_stage") else ""
    print(f"    peak {arm['peak_rss'] / 2**30:.2f} GiB{stage}{export}, {arm['wall_s']:.0f}s, "
          f"output {arm['output_bytes'] / 2**30:.2f} GiB{status}", flush=True)


def merge(previous: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The previous results with this run's shapes laid over them, arm by arm."""
    shapes = dict(previous.get("shapes", {}))
    for key, shape in measured.items():
        shapes[key] = {**shape, "arms": {**shapes.get(key, {}).get("arms", {}), **shape["arms"]}}
    order = [key for key in SHAPES if key in shapes]
    return {"scenario": "build_scale", "shapes": {key: shapes[key] for key in order}}


def _newest(data: dict[str, Any]) -> dict[str, Any] | None:
    """The newest shape's run record: the page merges shapes measured at different times (`--report-only` measures
    none), so its header names the latest run, not today's rewrite."""
    return max((shape["machine"] for shape in data["shapes"].values()), key=lambda m: m["date"], default=None)


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench build_scale`."""
    parser = argparse.ArgumentParser(prog="python -m bench build_scale")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of 100m,1b,8b (default: all)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="mbuild's (default: fp32,int8,int4; '' for none)")
    parser.add_argument("--gguf", default=",".join(GGUF_TYPES),
                        help="convert_hf_to_gguf.py --outtype values (default: q8_0,bf16,f32; '' for none)")
    parser.add_argument("--serve", default="int4",
                        help="precisions whose engine is also served once (default: int4; '' for none)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the .json")
    args = parser.parse_args(argv)
    chosen = {name: [v for v in getattr(args, name).split(",") if v]
              for name in ("shapes", "precisions", "gguf", "serve")}
    for name, allowed in (("shapes", SHAPES), ("precisions", PRECISIONS)):
        if unknown := set(chosen[name]) - set(allowed):
            parser.error(f"--{name}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    return {"shapes": chosen["shapes"], "precisions": chosen["precisions"], "gguf_types": chosen["gguf"],
            "serve": tuple(chosen["serve"]), "report_only": args.report_only}


def main(repeats: int = 1, shapes: list[str] | None = None, precisions: list[str] | None = None,
         gguf_types: list[str] | None = None, serve: tuple[str, ...] = ("int4",), report_only: bool = False,
         quick: bool = False, out: Path = OUT) -> Path:
    """Measure `shapes` (each arm once: `repeats` is not used), merge into build_scale.json, write the report.
    Quick: the 100m shape alone, mbuild int4 built and served, llama.cpp's converter only where llama.cpp is built
    (whoever built it has its converter's sentencepiece too)."""
    if quick:
        shapes, precisions, serve = ["100m"], ["int4"], ("int4",)
        if not llamacpp.built():
            gguf_types = []
            skipped("llama.cpp's converter arms", "they run where llama.cpp is built: `python -m bench llm_peer` "
                    "(no --quick) builds it once")
    record = out / "build_scale.json"
    previous: dict[str, Any] = json.loads(record.read_text()) if record.is_file() else {}
    measured: dict[str, Any] = {}
    if not report_only:
        for key in shapes or list(SHAPES):
            print(f"build scale: {SHAPES[key].title}", flush=True)
            measured[key] = measure_shape(SHAPES[key], list(PRECISIONS) if precisions is None else precisions,
                                          list(GGUF_TYPES) if gguf_types is None else gguf_types, serve)
    data = merge(previous, measured)
    path = write("build_scale", data, render(data, __doc__ or ""), out, measures=MEASURES, run=_newest(data))
    plot(data, out / "build_scale.png")
    print(path.read_text())
    return path
