"""Which TensorRT engine of a bundle runs on this GPU, or why none can.

A bundle may carry one engine per compute capability (model/engines/sm_90/, sm_89/, ...), each with
engine-meta.json (EngineMeta): the TensorRT version and GPU it was built with and its builder settings.
TensorRT plans only load on the compute capability and TensorRT version that built them (unless built
hardware- or version-compatible), so the choice and its refusals happen before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtimes.bundle import ENGINE_META_FILE, BundleError, EngineMeta, load_engine_meta
from runtimes.hardware import GpuInfo

ENGINES_DIR = "engines"
PLAN = "engine.plan"


@dataclass(frozen=True)
class BuiltEngine:
    folder: Path
    meta: EngineMeta

    @property
    def compute_capability(self) -> str:
        return self.meta.compute_capability

    @property
    def plan(self) -> Path:
        return self.folder / PLAN


def sm(compute_capability: str) -> str:
    return "sm_" + compute_capability.replace(".", "")


def built_engines(model_dir: Path) -> list[BuiltEngine]:
    found = [BuiltEngine(meta.parent, load_engine_meta(meta, str(meta.relative_to(model_dir))))
             for meta in sorted((model_dir / ENGINES_DIR).glob(f"*/{ENGINE_META_FILE}"))]
    if not found:
        raise BundleError(f"no TensorRT engine in {model_dir / ENGINES_DIR}")
    return found


def _same_major_minor(a: str, b: str) -> bool:
    return a.split(".")[:2] == b.split(".")[:2]


def choose_engine(model_dir: Path, gpu: GpuInfo | None, trt_version: str | None) -> BuiltEngine:
    """The engine for this device, or a BundleError that says what to rebuild."""
    engines = built_engines(model_dir)
    built_for = ", ".join(f"{sm(e.compute_capability)} ({e.meta.device_name})" for e in engines)
    if gpu is None:
        raise BundleError(f"this image runs TensorRT engines built for {built_for}, and no NVIDIA GPU is visible; "
                          "run it with --gpus all and the NVIDIA container toolkit")
    if trt_version is None:
        raise BundleError("this image runs TensorRT engines, and the tensorrt package is not importable here; "
                          "use the TensorRT base image the build chose")
    matching = [e for e in engines if e.compute_capability == gpu.compute_capability]
    portable = [e for e in engines if e.meta.build.hardware_compatibility == "AMPERE_PLUS"
                and tuple(map(int, gpu.compute_capability.split("."))) >= (8, 0)]
    candidates = matching or portable
    if not candidates:
        raise BundleError(f"the TensorRT engines here were built for {built_for}; this GPU ({gpu.name}) is "
                          f"{sm(gpu.compute_capability)}: rebuild for it (mbuild package MODEL --gpu <this GPU>), or "
                          "package several at once (--gpu h100,l40s)")
    engine = candidates[0]
    built_with = engine.meta.tensorrt_version
    if not engine.meta.build.version_compatible and not _same_major_minor(built_with, trt_version):
        raise BundleError(f"the engine for {sm(engine.compute_capability)} was built with TensorRT {built_with}, but "
                          f"this image runs TensorRT {trt_version}; plans only load in the version that built them: "
                          "rebuild, or use the base image the build chose")
    return engine
