"""Engine options, typed per backend: a profile's `engine_options` is checked against these when profiles load,
so a misspelt key or a wrong value is an error that names it, not a default silently used at compile time."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from builder.errors import InputError
from builder.planning.precisions import PRECISIONS
from runtimes.kernels import TILE_BLOCK


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OrtOptions(_Options):
    """ONNX Runtime (CPU): graph optimization and quantization."""

    graph_optimization: Literal["basic", "extended", "all"] = "extended"
    # Language models' linear layers: "dynamic" (int8 only: DynamicQuantizeMatMul), "blocks" (MatMulNBits,
    # 8-bit for int8, 4-bit for int4) or "tiles" (int8 only, blocks of 128: the same 8-bit blocks run by mbuild's
    # MatMulInt8Tiles on AVX-512 VNNI, runtimes/kernels/int8_tiles.cpp). Embeddings' int8 is always dynamic.
    quantization: Literal["dynamic", "blocks", "tiles"] | None = None
    per_channel: bool = False  # dynamic int8: one scale per output channel (cosine 0.945 -> 0.988 on MiniLM)
    reduce_range: bool = False  # dynamic int8: 7-bit weights, for CPUs without VNNI that saturate otherwise
    block_size: Literal[16, 32, 64, 128, 256] = 32  # blocks: weights per block, the sizes ORT's packer takes
    accuracy_level: int | None = Field(None, ge=0, le=4)  # int8/int4 language models: MatMulNBits compute type
    # Language models' KV cache: int8 is calibrated at build time (builder/engine/kv_cache_quant.py) and gated; a
    # build whose int8 cache fails the gate fails, since the plan sized the pool for it
    kv_cache: Literal["fp32", "int8"] = "fp32"
    # Language models' export: "fast-lane" (the graph mbuild writes by hand, for the families of
    # builder/model/families/), "generic" (traced from transformers' own modeling code, builder/engine/generic/) or
    # "auto" (the fast lane where a family has one). `--model-impl` sets it, as vLLM's --model-impl does.
    model_impl: Literal["auto", "fast-lane", "generic"] = "auto"

    @model_validator(mode="after")
    def _tiles_fit(self) -> OrtOptions:
        if self.quantization == "tiles" and self.block_size != TILE_BLOCK:
            raise ValueError(f"quantization tiles runs blocks of {TILE_BLOCK} (block_size {TILE_BLOCK})")
        return self

    def block_bits(self, precision: str) -> int | None:
        """Bits of a language model's MatMulNBits weights at `precision`; None: fp32, or int8 kept dynamic."""
        bits = PRECISIONS[precision].weight_bits
        if bits == 4 and self.quantization == "tiles":
            raise InputError("quantization tiles is for int8 (8-bit blocks); int4 runs blocks",
                             hint="set engine_options.quantization: blocks for int4")
        return None if bits == 8 and self.quantization == "dynamic" else bits  # dynamic: 8-bit only


class TrtOptions(_Options):
    """TensorRT (GPU): builder settings and the quantization the engine is built with."""

    builder_optimization_level: int = Field(3, ge=0, le=5)
    workspace_gb: float = Field(8, gt=0)
    quantization: Literal["fp8", "int8_weight_only", "nvfp4"] | None = None
    kv_cache: Literal["fp8"] | None = None
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    version_compatible: bool = False


ENGINE_OPTIONS: dict[str, type[_Options]] = {"onnxruntime": OrtOptions, "tensorrt": TrtOptions}


def option_problems(engine: str, options: dict[str, Any]) -> list[str]:
    """What is wrong with these options for this engine, one line per key; empty when they are fine."""
    model = ENGINE_OPTIONS[engine]
    try:
        model.model_validate(options)
    except ValidationError as exc:
        allowed = ", ".join(model.model_fields)
        return [f"engine_options.{'.'.join(str(p) for p in e['loc'])}: {engine} has no such option (allowed: {allowed})"
                if e["type"] == "extra_forbidden" else
                f"engine_options.{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e['input']!r})"
                for e in exc.errors()]
    return []


def _typed(engine: str, options: dict[str, Any]) -> Any:
    problems = option_problems(engine, options)
    if problems:  # profiles are checked at load; this catches one made in code (model_copy skips validation)
        raise InputError("; ".join(problems), hint="fix engine_options in the profile")
    return ENGINE_OPTIONS[engine].model_validate(options)


def ort_options(options: dict[str, Any]) -> OrtOptions:
    typed: OrtOptions = _typed("onnxruntime", options)
    return typed


def model_impl(engine: str, options: dict[str, Any]) -> str:
    """A language model's export as a profile sets it (TensorRT's: always the fast lane's graph, "auto")."""
    return ort_options(options).model_impl if engine == "onnxruntime" else "auto"


def trt_options(options: dict[str, Any]) -> TrtOptions:
    typed: TrtOptions = _typed("tensorrt", options)
    return typed
