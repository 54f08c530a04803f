"""engine-meta.json: what built one TensorRT engine (version, GPU) and what its builder was told (TrtBuild).

Written by the builder's compile stage beside each plan (model/engines/sm_XX/); read by the runtime to choose
the engine for its GPU (runtimes/engines/gpu_select.py) and, with MBUILD_TRT_BUILD_AT_START=1, to build one at
start. TrtBuild is also what runtimes/engines/tensorrt_engine.build_plan takes at package time: the builder's
TrtSettings carries one, so the settings a plan was built with and the ones a start builds with are one type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from runtimes.bundle.codec import bounds, check_format, decode, encode

ENGINE_META_FILE = "engine-meta.json"
ENGINE_META_FORMAT = 1
Compatibility = Literal["NONE", "AMPERE_PLUS", "SAME_COMPUTE_CAPABILITY"]  # TensorRT's HardwareCompatibilityLevel
# The BuilderFlag names a weakly typed build sets (planning/precisions.py's trt_flags); bounded here so a file
# naming another is refused when read, not an AttributeError inside TensorRT's builder.
PrecisionFlag = Literal["FP16", "BF16"]


@dataclass(frozen=True)
class ShapeRange:
    """One input's shapes in an optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class TrtBuild:
    """What TensorRT's builder is told: flags, memory, compatibility and one shape profile per phase."""

    precision_flags: tuple[PrecisionFlag, ...]  # BuilderFlag names (weak typing); empty when strongly typed
    strongly_typed: bool
    workspace_bytes: int = field(metadata=bounds(1, 1 << 50))
    optimization_level: int = field(metadata=bounds(0, 5))
    hardware_compatibility: Compatibility
    version_compatible: bool
    profiles: tuple[dict[str, ShapeRange], ...]


@dataclass(frozen=True)
class EngineMeta:
    tensorrt_version: str
    compute_capability: str  # of the GPU that built it, e.g. "9.0"
    device_name: str
    gpu_model: str  # the target the plan named (h100)
    profile: str
    build: TrtBuild
    timing_cache_sha256: str
    format: int = ENGINE_META_FORMAT

    @classmethod
    def from_dict(cls, raw: object, source: str = ENGINE_META_FILE) -> EngineMeta:
        """source names the file in errors (engines/sm_90/engine-meta.json: a bundle has one per GPU)."""
        check_format(raw, source, ENGINE_META_FORMAT)
        return decode(cls, raw, source)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data
