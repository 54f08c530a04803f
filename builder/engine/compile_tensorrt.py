"""GPU compile: a TensorRT engine per target GPU, built on that GPU, stored with what built it.

The TensorRT calls themselves live in runtimes.engines.tensorrt_engine (the one module that makes
them); this stage checks the host can build, computes the settings, and lays out the bundle:
model/engines/sm_XX/{engine.plan, engine-meta.json (EngineMeta)}. A host without TensorRT or without the target
GPU stops here with what it needs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from builder.engine.exported import ExportResult, ExportShape
from builder.engine.tensorrt_settings import TrtSettings, trt_settings
from builder.errors import ToolMissing
from builder.planning.plan import BuildPlan, EngineTarget
from builder.resources import mbuild_cache_dir
from runtimes.bundle import ENGINE_META_FILE, EngineConfig, EngineMeta
from runtimes.bundle.codec import write_contract
from runtimes.engines import gpu_select, tensorrt_engine
from runtimes.hardware import GpuInfo, detect_gpus

SETTINGS_FILE = "tensorrt.json"


def settings_for(plan: BuildPlan, exported: ExportShape) -> dict[str, TrtSettings]:
    """The builder settings of every engine of the plan, by compute capability (tensorrt.json holds them)."""
    return {gpu_select.sm(e.compute_capability): trt_settings(e.profile, plan.task, exported, e.compute_capability)
            for e in plan.engines}


def settings_json(plan: BuildPlan, exported: ExportShape) -> str:
    """tensorrt.json's text."""
    settings = {sm: s.to_dict() for sm, s in settings_for(plan, exported).items()}
    return json.dumps(settings, indent=2, sort_keys=True) + "\n"


def _device_for(engine: EngineTarget, gpus: tuple[GpuInfo, ...]) -> int:
    for index, gpu in enumerate(gpus):
        if gpu.compute_capability == engine.compute_capability:
            return index
    found = ", ".join(f"{g.name} (sm_{g.compute_capability.replace('.', '')})" for g in gpus) or "none"
    raise ToolMissing(
        f"the {engine.gpu_model} engine must be built on a {gpu_select.sm(engine.compute_capability)} GPU, and this "
        f"host has {found}",
        hint="build on a host with that GPU (TensorRT engines are bound to the GPU that builds them), or set "
             "hardware_compatibility: ampere_plus in the profile")


def compile_engines(plan: BuildPlan, onnx_path: Path, engine_dir: Path, exported: ExportResult) -> EngineConfig:
    version = tensorrt_engine.trt_version()
    if version is None:
        targets = ", ".join(f"{e.gpu_model} ({gpu_select.sm(e.compute_capability)})" for e in plan.engines)
        raise ToolMissing(
            f"the TensorRT compile stage needs TensorRT and an NVIDIA GPU of each target ({targets}); this host has "
            "no TensorRT Python package",
            hint="on a GPU build host: pip install 'mbuild[tensorrt]' (TensorRT 10.x with cuda-python); "
                 "or package for the CPU with --gpu cpu; --plan-only writes the GPU build context without building")
    gpus = detect_gpus()
    all_settings = settings_for(plan, exported)
    for engine in plan.engines:
        index = _device_for(engine, gpus)
        settings = all_settings[gpu_select.sm(engine.compute_capability)]
        if settings.explicit_quantization:
            raise ToolMissing(f"{engine.profile.precision} engines need an ONNX graph with Q/DQ nodes, which this "
                              "mbuild does not write yet", hint="use an fp16 or bf16 profile (--precision fp16)")
        tensorrt_engine.use_device(index)
        cache = mbuild_cache_dir() / "tensorrt" / f"timing-{version}-{gpu_select.sm(engine.compute_capability)}.cache"
        # The runtime's builder takes its own contract (TrtBuild): runtimes/ never imports builder's types.
        plan_bytes = tensorrt_engine.build_plan(onnx_path, settings.build, cache)
        folder = engine_dir / gpu_select.ENGINES_DIR / gpu_select.sm(engine.compute_capability)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / gpu_select.PLAN).write_bytes(plan_bytes)
        meta = EngineMeta(tensorrt_version=version, compute_capability=engine.compute_capability,
                          device_name=gpus[index].name, gpu_model=engine.gpu_model, profile=engine.profile.name,
                          build=settings.build, timing_cache_sha256=hashlib.sha256(cache.read_bytes()).hexdigest())
        write_contract(folder / ENGINE_META_FILE, meta)
    return exported.engine_config("tensorrt", gpu_select.ENGINES_DIR, plan.profile.precision, plan.batching)
