"""A published checkpoint's quantization, read from config.json's `quantization_config`: which format its
weights are stored in, what they take on disk (the plan counts the download as stored), and a refusal before any
weight is downloaded for a method mbuild does not read.

The formats are the ones vLLM, SGLang and TensorRT-LLM read from the same field: MXFP4 (gpt-oss), FP8 E4M3 with
block scales (DeepSeek-V3/R1, Qwen3-FP8) or per-channel/per-tensor ones, GPTQ (v1 and v2 zero points, act-order),
AWQ (GEMM packing), and compressed-tensors' int, float and pack-quantized weights. builder/engine/dequant/ reads
each back to fp32, a block of rows at a time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.errors import UnsupportedModel

MXFP4, FP8, GPTQ, AWQ, COMPRESSED = "mxfp4", "fp8", "gptq", "awq", "compressed-tensors"
READ = (MXFP4, FP8, GPTQ, AWQ, COMPRESSED)
# compressed-tensors' formats read (the library's CompressionFormat values)
COMPRESSED_FORMATS = ("int-quantized", "float-quantized", "pack-quantized", "naive-quantized")
# What docs/models.md says of each format read: (quant_method, the stored tensors read, how the build uses them)
DESCRIBED = (
    (MXFP4, "gpt-oss's experts: `*_blocks` (E2M1 pairs) and `*_scales` (E8M0, a power of two per 32)",
     "decoded exactly to fp32"),
    (FP8, "E4M3/E5M2 weights with `weight_scale_inv` blocks (DeepSeek-V3/R1: 128x128; fp32 or UE8M0 exponents) "
          "or a channel's or the tensor's `weight_scale`; experts a tensor each or stacked [E, N, K]",
     "decoded exactly to fp32"),
    (GPTQ, "`qweight`/`qzeros`/`scales`/`g_idx` at 2, 4 or 8 bits; v1 (`gptq`) and v2 (`gptq_v2`) zero points; "
           "act-order", "decoded exactly to fp32"),
    (AWQ, "GEMM-packed int4 `qweight`/`qzeros`/`scales`", "decoded exactly to fp32"),
    (COMPRESSED, "`pack-quantized` (2, 4, 8 bits, symmetric or with zero points), `int-quantized` (int8), "
                 "`float-quantized` (FP8)", "decoded exactly to fp32"),
)
MXFP4_BYTES = 17 / 32  # a block of 32 four-bit values and their shared 8-bit exponent (gpt-oss's experts)


@dataclass(frozen=True)
class SourceFormat:
    """How a checkpoint's quantized weights are stored."""

    method: str  # quant_method as published: one of READ
    bits: int = 0  # GPTQ/AWQ/pack-quantized integer width; 8 for FP8 and int-quantized
    group: int = 0  # input columns sharing a scale; 0: a whole row (per channel) or the block scales say
    zero_offset: int = 0  # GPTQ v1 stores each zero point minus one: added back on reading
    fmt: str = ""  # compressed-tensors' format; AWQ's version

    @property
    def integer(self) -> bool:
        """Integer codes, zero points and scales in groups (GPTQ, AWQ, compressed-tensors' pack-quantized)."""
        return self.method in (GPTQ, AWQ) or self.fmt == "pack-quantized"

    def kept_in_blocks(self, bits: int, block: int) -> bool:
        """Whether n-bit blocks of `block` columns (MatMulNBits) hold this format's codes as they are (an act-order
        GPTQ's with its columns sorted by group, the input gathered alike)."""
        return self.integer and self.bits == bits and self.group == block

    @property
    def label(self) -> str:
        """What the report and engine.json name as the source's format."""
        detail = f"{self.fmt} " if self.fmt else ""
        width = f" int{self.bits}" if self.integer else ""
        group = f" g{self.group}" if self.group > 0 else ""
        return f"{self.method} {detail}".strip() + width + group

    def bytes_per_weight(self) -> float:
        """A quantized weight's stored bytes, its scales (and zeros) counted."""
        if self.method == MXFP4:
            return MXFP4_BYTES
        if self.bits >= 8:
            return 1.0
        scale = 2.0 / self.group if self.group > 0 else 0.0  # an fp16 scale (and a packed zero) a group
        return self.bits / 8 + scale


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _refuse(what: str) -> UnsupportedModel:
    return UnsupportedModel(f"the checkpoint is quantized with {what}, which mbuild does not read",
                            hint=f"mbuild reads {', '.join(READ)} checkpoints and F32/F16/BF16 ones; use a copy of "
                                 "the model in one of those")


def source_format(config: Mapping[str, Any]) -> SourceFormat | None:
    """The checkpoint's format, None for an unquantized one; refused (UnsupportedModel) when mbuild cannot read it.
    Only config.json is needed, so a plan refuses before the weights are downloaded."""
    quant = config.get("quantization_config")
    if quant is None:
        text = config.get("text_config")
        quant = text.get("quantization_config") if isinstance(text, Mapping) else None
    if quant is None:
        return None
    if not isinstance(quant, Mapping):
        raise UnsupportedModel("config.json's quantization_config is not an object", hint="is config.json intact?")
    method = str(quant.get("quant_method") or "")
    if method in (MXFP4, FP8):
        return SourceFormat(method, 8 if method == FP8 else 4)
    if method == GPTQ:
        bits, group = _int(quant.get("bits")), _int(quant.get("group_size"), -1)
        if bits not in (2, 4, 8):
            raise _refuse(f"GPTQ at {bits} bits (mbuild reads 2, 4 and 8)")
        v2 = str(quant.get("checkpoint_format") or "gptq") == "gptq_v2"
        return SourceFormat(GPTQ, bits, max(group, 0), 0 if v2 else 1)
    if method == AWQ:
        bits, version = _int(quant.get("bits", quant.get("w_bit"))), str(quant.get("version") or "gemm").lower()
        if bits != 4 or version != "gemm":
            raise _refuse(f"AWQ {version} at {bits} bits (mbuild reads GEMM-packed int4)")
        return SourceFormat(AWQ, 4, _int(quant.get("group_size", quant.get("q_group_size")), 128), fmt=version)
    if method == COMPRESSED:
        return _compressed(quant)
    raise _refuse(repr(method) if method else "no quant_method named")


def _compressed(quant: Mapping[str, Any]) -> SourceFormat:
    """compressed-tensors: one format for the checkpoint, the weights' bits and group from its config groups."""
    fmt = str(quant.get("format") or "")
    if fmt not in COMPRESSED_FORMATS:
        raise _refuse(f"compressed-tensors' {fmt!r} format (mbuild reads {', '.join(COMPRESSED_FORMATS)})")
    groups = quant.get("config_groups") or {}
    weights = [g.get("weights") for g in groups.values() if isinstance(g, Mapping)] if isinstance(groups, Mapping) \
        else []
    schemes = {(_int(w.get("num_bits"), 8), _int(w.get("group_size"))) for w in weights if isinstance(w, Mapping)}
    if len(schemes) > 1:
        raise _refuse(f"compressed-tensors with {len(schemes)} weight schemes in one checkpoint")
    bits, group = next(iter(schemes), (8, 0))
    return SourceFormat(COMPRESSED, bits, group, fmt=fmt)
