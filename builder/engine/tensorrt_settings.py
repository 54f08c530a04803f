"""What the TensorRT builder is told for a profile: precision, shapes, workspace, compatibility.

Pure: computed from the profile, the exported graph's inputs and the target GPU, saved in the build
context as tensorrt.json (golden-tested). What TensorRT's builder is told is the runtime's TrtBuild
(runtimes/bundle/tensorrt.py), handed to the one module that calls TensorRT and kept in engine-meta.json;
TrtSettings adds what planning knows around it.

Precisions:
  fp16, bf16          weak typing: the builder may run layers in that precision (FP16 / BF16 flags)
  fp8, int8, nvfp4    explicit quantization: the ONNX graph must carry Q/DQ nodes (NVIDIA ModelOpt
                      writes them) and the network is strongly typed, so TensorRT keeps those types
Shapes:
  embeddings          one optimization profile over batch x sequence
  language models     two: prefill (no past, up to the context) and decode (one new token, past up to
                      the context): the runs a step packs for such an engine, which is served unchunked, without
                      the prefix cache or speculation (runtimes/generation/loader.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from builder.engine.exported import ExportShape
from builder.errors import InputError, UnsupportedModel
from builder.planning.engine_options import trt_options
from builder.planning.precisions import PRECISIONS
from builder.planning.profiles import Profile
from runtimes.bundle.codec import encode
from runtimes.bundle.engine import ENCODER_TASKS
from runtimes.bundle.tensorrt import Compatibility, ShapeRange, TrtBuild
from runtimes.engines.states import STATE

COMPATIBILITY: dict[str, Compatibility] = {
    "none": "NONE", "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
GB = 1 << 30


@dataclass(frozen=True)
class TrtSettings:
    """One engine's settings as planned (tensorrt.json holds them by GPU; nothing reads them back)."""

    compute_capability: str
    gpu_model: str
    precision: str
    explicit_quantization: str | None  # ModelOpt quantize_mode when Q/DQ nodes are needed
    build: TrtBuild

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data


def _encoder_profiles(inputs: list[str], max_batch: int, max_seq: int) -> tuple[dict[str, ShapeRange], ...]:
    typical = ShapeRange((1, 1), (max(1, max_batch // 4), min(128, max_seq)), (max_batch, max_seq))
    return ({name: typical for name in inputs},)


def _decoder_profiles(inputs: list[str], max_batch: int, context: int, kv_heads: int,
                      head_dim: int) -> tuple[dict[str, ShapeRange], ...]:
    past = [n for n in inputs if n.startswith("past.")]
    half = max(1, context // 2)
    prefill = {
        "input_ids": ShapeRange((1, 1), (1, min(512, context)), (max_batch, context)),
        "attention_mask": ShapeRange((1, 1), (1, min(512, context)), (max_batch, context)),
        "position_ids": ShapeRange((1, 1), (1, min(512, context)), (max_batch, context)),
        "logits_at": ShapeRange((1,), (1,), (max_batch * context,)),  # a row's last, or each (prompt logprobs)
        **{n: ShapeRange((1, kv_heads, 0, head_dim), (1, kv_heads, 0, head_dim), (max_batch, kv_heads, 0, head_dim))
           for n in past},
    }
    batch_opt = max(1, max_batch // 2)
    decode = {
        "input_ids": ShapeRange((1, 1), (batch_opt, 1), (max_batch, 1)),
        "attention_mask": ShapeRange((1, 2), (batch_opt, half + 1), (max_batch, context)),
        "position_ids": ShapeRange((1, 1), (batch_opt, 1), (max_batch, 1)),
        "logits_at": ShapeRange((1,), (batch_opt,), (max_batch,)),
        **{n: ShapeRange((1, kv_heads, 1, head_dim), (batch_opt, kv_heads, half, head_dim),
                         (max_batch, kv_heads, context - 1, head_dim)) for n in past},
    }
    return prefill, decode


def trt_settings(profile: Profile, task: str, exported: ExportShape, compute_capability: str) -> TrtSettings:
    """exported: the graph's inputs, longest sequence and (decoders) the KV cache geometry."""
    options = trt_options(profile.engine_options)
    inputs = list(exported.inputs)
    max_batch = profile.limits.max_batch
    if task in ENCODER_TASKS:
        shapes = _encoder_profiles(inputs, max_batch, exported.max_seq_length)
    elif exported.geometry is not None:
        context = min(exported.max_seq_length, profile.limits.context or exported.max_seq_length)
        geometry = exported.geometry
        if any(not heads for heads, _ in geometry.shapes) or any(i.startswith(STATE) for i in inputs):
            raise UnsupportedModel("its layers keep a recurrent state, which mbuild's TensorRT engine does not carry "
                                   "yet", hint="a profile for ONNX Runtime builds it")
        if geometry.layer_shapes:  # its profiles give every past input one shape
            raise UnsupportedModel("its layers' KV caches differ in shape, which mbuild's TensorRT engine does not "
                                   "hold yet", hint="a profile for ONNX Runtime builds it")
        shapes = _decoder_profiles(inputs, max_batch, context, geometry.kv_heads, geometry.head_dim)
    else:
        raise InputError("a language model's TensorRT settings need its KV cache geometry; the export has none")
    row = PRECISIONS[profile.precision]
    explicit, weak = row.trt_quantize, row.trt_flags
    if weak is None and explicit is None:
        raise InputError(f"precision {profile.precision} has no TensorRT mapping")
    return TrtSettings(
        compute_capability=compute_capability,
        gpu_model=profile.hardware,
        precision=profile.precision,
        explicit_quantization=explicit,
        build=TrtBuild(
            precision_flags=weak or (),
            strongly_typed=explicit is not None,
            workspace_bytes=int(options.workspace_gb * GB),
            optimization_level=options.builder_optimization_level,
            hardware_compatibility=COMPATIBILITY[options.hardware_compatibility],
            version_compatible=options.version_compatible,
            profiles=shapes,
        ),
    )
