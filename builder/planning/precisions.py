"""The one precision table: what each precision costs, where it runs, and how TensorRT builds it.

Profiles, selection, memory estimates, the TensorRT settings, the ONNX Runtime quantizer and the CLI all read
this table; a new precision is one row here (and its name in `Precision`, which pydantic needs as a Literal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from runtimes.bundle.tensorrt import PrecisionFlag

Precision = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4", "nvfp4"]


@dataclass(frozen=True)
class PrecisionInfo:
    bytes_per_param: float  # 4-bit formats carry a scale per block of 16-32 weights
    cpu: bool  # ONNX Runtime on CPU runs it
    quantized: bool  # integer weights: CPU kernels that gain from the host's instruction set
    min_compute_capability: tuple[int, int] | None = None  # GPUs older than this cannot run it
    trt_flags: tuple[PrecisionFlag, ...] | None = None  # weakly typed TensorRT: builder flags (None: not weakly typed)
    trt_quantize: str | None = None  # strongly typed TensorRT: the ModelOpt quantize mode
    weight_bits: int | None = None  # bits of a language model's linear weights in ONNX Runtime (MatMulNBits)


PRECISIONS: dict[str, PrecisionInfo] = {
    "fp32": PrecisionInfo(4.0, cpu=True, quantized=False, trt_flags=()),
    "fp16": PrecisionInfo(2.0, cpu=False, quantized=False, trt_flags=("FP16",)),
    "bf16": PrecisionInfo(2.0, cpu=False, quantized=False, trt_flags=("BF16",)),
    "fp8": PrecisionInfo(1.0, cpu=False, quantized=False, min_compute_capability=(8, 9), trt_quantize="fp8"),
    "int8": PrecisionInfo(1.0, cpu=True, quantized=True, trt_quantize="int8", weight_bits=8),
    "int4": PrecisionInfo(0.5625, cpu=True, quantized=True, weight_bits=4),
    "nvfp4": PrecisionInfo(0.5625, cpu=False, quantized=False, min_compute_capability=(10, 0), trt_quantize="nvfp4"),
}
# Quantized CPU language models keep the token table in 8-bit blocks of 32 (llama.cpp's q8_0 layout) with an fp32
# scale each: the export writes it so (builder/engine/decoder_graph.py), memory estimates count it from these.
TABLE_BITS, TABLE_BLOCK = 8, 32

assert set(PRECISIONS) == set(get_args(Precision)), "PRECISIONS and Precision must name the same precisions"

CPU_PRECISIONS = tuple(name for name, info in PRECISIONS.items() if info.cpu)
