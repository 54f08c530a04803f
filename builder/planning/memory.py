"""How much memory a model needs under a profile, to serve and to build.

Serving: weights as the engine stores them (a mixture of experts': every expert's), the KV pool (by default
max_batch sequences x context tokens: runtimes/generation/kv_pool.py), and headroom (an encoder's with its longest
sequence's attention scores past the engine's budget); divided by tensor parallelism. start_gb is what a ready
server holds: weights and the serving processes, and on a GPU the KV cache and its overhead; a CPU server commits
the pool's pages as sequences fill them (runtimes/engines/kv_memory.py), so its KV is not held at start. Speed: a
decode step reads the weights of the experts a token is routed to, not all of them (decode_read_gb). The runtime
caches the whole context for every layer, sliding-window layers too (runtimes/engines/decoder.py), so that is what
is planned; kv_window_gb is what a cache holding only the window there would take. Building: CPU language-model
engines are written from the checkpoint a block at a time and gated against a reference that holds one decoder
layer (builder/engine/checkpoint.py, reference.py), so the build needs the engine (the gate runs it) or one fp32
layer, whichever is larger, beside the build process itself; other builds load the whole model in PyTorch
(torch.onnx, sentence-transformers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from builder.model.catalog import ModelFacts
from builder.planning.engine_options import ort_options, trt_options
from builder.planning.precisions import PRECISIONS, TABLE_BITS, TABLE_BLOCK
from builder.planning.profiles import Profile
from runtimes.bundle.engine import ATTENTION_BUDGET_BYTES, KV_BLOCK_TOKENS, attention_bytes

GPU_OVERHEAD_GB = 2.0  # CUDA context, TensorRT workspace and activations, per GPU
CPU_OVERHEAD_GB = 1.0  # interpreter, runtime, activations
# The serving processes at ready beside the weights (BentoML's supervisor and worker, Python, ONNX Runtime):
# 0.45-0.5 GB measured with a 64 MB engine, tree RSS
RUNTIME_BASE_GB = 0.5
USABLE_FRACTION = 0.95  # of what NVML (or /proc/meminfo) reports
EMBED_BYTES_QUANTIZED = TABLE_BITS / 8 + 4 / TABLE_BLOCK  # a quantized token table: its bytes and a block's scale
BUILD_BASE_GB = 0.7  # the build process: Python, PyTorch, transformers, ONNX Runtime, tokenizer (measured: 0.6-0.7)
BLOCK_GB = 0.4  # checkpoint rows in flight while the export writes (64 MB blocks, widened and quantized)
TORCH_BUILD_FACTOR = 2.5  # torch.onnx holds the fp32 model and the graph it writes (measured 2.1x on 600M)


@dataclass(frozen=True)
class MemoryNeed:
    weights_gb: float
    kv_cache_gb: float  # the KV pool: the most its sequences' keys and values and the prefix cache hold together
    overhead_gb: float
    per_device_gb: float  # per GPU, or for the whole host on CPU
    start_gb: float = 0.0  # per device at ready: weights, every slot's KV cache, the serving processes
    build_gb: float = 0.0  # RAM the build needs (export, compile, gate), on the build host
    build_disk_gb: float = 0.0  # disk the build writes: the engine, and the checkpoint if not cached
    decode_read_gb: float = 0.0  # weights one decode step reads: the routed experts', the LM head, no token table
    kv_window_gb: float = 0.0  # the KV cache if sliding-window layers kept only their window (not done yet)
    kv_tokens: float = 0.0  # the tokens the KV pool holds (in 16-token blocks)
    kv_start_gb: float = 0.0  # of the KV pool, what a ready server holds (a GPU's whole cache; none on a CPU)

    @property
    def rounded_gb(self) -> float:
        """per_device_gb rounded up to 0.1 GB: what messages and the image's requirements state."""
        return math.ceil(self.per_device_gb * 10) / 10

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in self.__dict__.items()}

    def with_draft(self, draft: MemoryNeed) -> MemoryNeed:
        """This need with a draft model's served beside it (its weights and KV cache; the serving processes and
        headroom once) and built after it (the larger build's RAM; both engines' disk)."""
        held = draft.weights_gb + draft.kv_cache_gb
        return MemoryNeed(self.weights_gb + draft.weights_gb, self.kv_cache_gb + draft.kv_cache_gb,
                          self.overhead_gb, self.per_device_gb + held,
                          self.start_gb + draft.weights_gb + draft.kv_start_gb,
                          max(self.build_gb, draft.build_gb), self.build_disk_gb + draft.build_disk_gb,
                          self.decode_read_gb, self.kv_window_gb + draft.kv_window_gb, self.kv_tokens,
                          self.kv_start_gb + draft.kv_start_gb)


def kv_bytes_per_value(profile: Profile) -> float:
    if profile.device == "cpu":  # ONNX Runtime's CPU cache: fp32, or int8 where the profile asks
        return 1.0 if ort_options(profile.engine_options).kv_cache == "int8" else 4.0
    return 1.0 if profile.engine == "tensorrt" and trt_options(profile.engine_options).kv_cache == "fp8" else 2.0


def served_context(facts: ModelFacts, profile: Profile) -> int:
    """The tokens a sequence may hold: the profile's limit, within the model's own."""
    return min(profile.limits.context or facts.context, facts.context)


def kv_bytes_per_token(facts: ModelFacts, profile: Profile) -> float:
    """A key and a value for every layer's KV heads (one cache for both where the values are the keys)."""
    return facts.kv_kinds * facts.kv_values * kv_bytes_per_value(profile)


def kv_pool_tokens(facts: ModelFacts, profile: Profile) -> int:
    """The tokens the KV pool is planned to hold: every slot's whole context, in whole blocks."""
    return profile.limits.max_batch * -(-served_context(facts, profile) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS


def kv_pool_bytes(facts: ModelFacts, profile: Profile) -> int:
    """The KV pool's planned memory, engine.json's batching.kv_cache_bytes (0: not a language model). In bytes, not
    tokens: an engine whose int8 cache failed its gate keeps fp32 in the same memory, a quarter of the tokens."""
    if facts.task != "text-generation":
        return 0
    return int(kv_pool_tokens(facts, profile) * kv_bytes_per_token(facts, profile))


def _param_bytes(facts: ModelFacts, profile: Profile) -> tuple[float, float | None]:
    """Bytes a linear layer's weight takes as the engine stores it, and a token table's (None: the same)."""
    per_param = PRECISIONS[profile.precision].bytes_per_param
    if facts.task != "text-generation" or profile.engine != "onnxruntime":
        return per_param, None
    options = ort_options(profile.engine_options)
    bits = options.block_bits(profile.precision)
    if bits:
        per_param = bits / 8 + 4 / options.block_size  # and an fp32 scale a block
    return per_param, 4.0 if profile.precision == "fp32" else EMBED_BYTES_QUANTIZED


def _weight_bytes(facts: ModelFacts, profile: Profile) -> float:
    """Bytes of weights as the engine stores them."""
    linear, table = _param_bytes(facts, profile)
    if table is None:
        return facts.params * 1e9 * linear
    # The LM head is a linear layer at the profile's precision; a tied one is written as its own matrix.
    return (facts.params * 1e9 - (0 if facts.tied else facts.table)) * linear + facts.table * table


def _decode_read_bytes(facts: ModelFacts, profile: Profile) -> float:
    """Weight bytes one decode step reads: its parameters' (the routed experts', the LM head's), each linear."""
    return facts.decode_params * 1e9 * _param_bytes(facts, profile)[0] if facts.task == "text-generation" else 0.0


def _build_need(facts: ModelFacts, profile: Profile, engine_gb: float) -> tuple[float, float]:
    """(RAM, disk) in GB for building the engine on this host."""
    disk = engine_gb + facts.download_gb
    if facts.task == "text-generation" and profile.engine == "onnxruntime":
        tables = facts.vocab * facts.hidden * (1 if facts.tied else 2)
        layer_fp32 = (facts.params * 1e9 - tables) / facts.layers * 4 / 1e9
        return BUILD_BASE_GB + max(BLOCK_GB, engine_gb, 2 * layer_fp32), disk
    return BUILD_BASE_GB + facts.params * 4 * TORCH_BUILD_FACTOR + engine_gb, disk


def memory_need(facts: ModelFacts, profile: Profile) -> MemoryNeed:
    weights = _weight_bytes(facts, profile) / 1e9
    kv = window_kv = tokens = 0.0
    if facts.task == "text-generation":
        context = served_context(facts, profile)
        tokens = float(kv_pool_tokens(facts, profile))
        per_layer = kv_bytes_per_token(facts, profile) / facts.layers * profile.limits.max_batch / 1e9
        kv = per_layer * facts.layers * context
        window = min(facts.sliding_window or context, context)
        window_kv = per_layer * ((facts.layers - facts.sliding_layers) * context + facts.sliding_layers * window)
    overhead = CPU_OVERHEAD_GB if profile.device == "cpu" else GPU_OVERHEAD_GB
    if facts.task != "text-generation" and profile.engine == "onnxruntime":
        overhead += attention_gb(facts, profile)
    build, disk = _build_need(facts, profile, weights)
    kv_start = 0.0 if profile.device == "cpu" else kv  # a CPU server commits the pool's pages as they fill
    start = (weights + kv_start) / profile.tp + (RUNTIME_BASE_GB if profile.device == "cpu" else overhead)
    return MemoryNeed(weights, kv, overhead, (weights + kv) / profile.tp + overhead, start, build, disk,
                      _decode_read_bytes(facts, profile) / 1e9, window_kv, tokens, kv_start)


def attention_gb(facts: ModelFacts, profile: Profile) -> float:
    """An encoder's attention scores beyond what the headroom holds: the runtime splits a batch past
    ATTENTION_BUDGET_BYTES, but a sequence of the served context alone can hold more (a decoder body's 16 heads at
    4k tokens: 3.2 GB)."""
    longest = attention_bytes(facts.heads, served_context(facts, profile))
    return max(0.0, longest - ATTENTION_BUDGET_BYTES) / 1e9


def fits(need: MemoryNeed, available_gb: float) -> bool:
    return need.per_device_gb <= available_gb * USABLE_FRACTION
