"""How much memory a model needs under a profile: weights at its precision, the KV cache the
profile reserves (max_batch sequences x context tokens), and headroom; divided by tensor parallelism."""

from __future__ import annotations

import math
from dataclasses import dataclass

from builder.model.catalog import ModelFacts
from builder.planning.engine_options import trt_options
from builder.planning.precisions import PRECISIONS
from builder.planning.profiles import Profile

GPU_OVERHEAD_GB = 2.0  # CUDA context, TensorRT workspace and activations, per GPU
CPU_OVERHEAD_GB = 1.0  # interpreter, runtime, activations
USABLE_FRACTION = 0.95  # of what NVML (or /proc/meminfo) reports


@dataclass(frozen=True)
class MemoryNeed:
    weights_gb: float
    kv_cache_gb: float
    overhead_gb: float
    per_device_gb: float  # per GPU, or for the whole host on CPU

    @property
    def rounded_gb(self) -> float:
        """per_device_gb rounded up to 0.1 GB: what messages and the image's requirements state."""
        return math.ceil(self.per_device_gb * 10) / 10

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in self.__dict__.items()}


def kv_bytes_per_value(profile: Profile) -> float:
    if profile.device == "cpu":
        return 4.0  # ONNX Runtime keeps the CPU KV cache in fp32
    return 1.0 if profile.engine == "tensorrt" and trt_options(profile.engine_options).kv_cache == "fp8" else 2.0


def memory_need(facts: ModelFacts, profile: Profile) -> MemoryNeed:
    weights = facts.params * 1e9 * PRECISIONS[profile.precision].bytes_per_param / 1e9
    kv = 0.0
    if facts.task == "text-generation":
        context = min(profile.limits.context or facts.context, facts.context)
        per_token = 2 * facts.layers * facts.kv_heads * facts.head_dim * kv_bytes_per_value(profile)
        kv = per_token * context * profile.limits.max_batch / 1e9
    overhead = CPU_OVERHEAD_GB if profile.device == "cpu" else GPU_OVERHEAD_GB
    return MemoryNeed(weights, kv, overhead, (weights + kv) / profile.tp + overhead)


def fits(need: MemoryNeed, available_gb: float) -> bool:
    return need.per_device_gb <= available_gb * USABLE_FRACTION
