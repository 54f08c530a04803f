"""engine.json: how to run the compiled model. Written by the builder's compile stage, read by the runtime.

`options` is typed by the task: an encoder's embedding width and pooling, a decoder's vocabulary and KV cache
geometry, template and stop tokens. `batching` is the plan's (the engine cache rewrites it per plan); the
runtime never falls back to a default of its own. `onnxruntime` holds that backend's build settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from runtimes.bundle.codec import ContractError, bounds, check_format, decode, encode

ENGINE_FILE = "engine.json"
ENGINE_FORMAT = 1
DEFAULT_MAX_BATCH = 32  # sequences per engine call (decoders: KV cache slots); the profiles' default
KV_BLOCK_TOKENS = 16  # a decoder's KV pool counts, and its prefix cache reuses, blocks of this many (vLLM's default)
Task = Literal["embedding", "rerank", "text-generation"]
# The tasks the encoder engine serves: one batched pass a request, no KV cache (runtimes/engines/encoder.py).
ENCODER_TASKS: frozenset[str] = frozenset({"embedding", "rerank"})
# An encoder's eager attention holds [batch, heads, length, length] fp32 scores in each layer: a few copies at once
# (scores, masked, softmax; 2.1-2.2x one copy measured on a Qwen3 body in ONNX Runtime), so 8 pairs of 8k tokens on
# 16 heads would take ~70 GB. The encoder engine splits a batch past this budget (a lone sequence runs alone), and the
# plan counts a longest sequence's scores beyond it.
ATTENTION_SCORE_COPIES = 3  # the measured 2.2, rounded up: a budget that errs on the safe side
ATTENTION_BUDGET_BYTES = 512 * 2**20


def attention_bytes(heads: int, length: int) -> float:
    """The attention scores one sequence of `length` tokens holds at once in an encoder layer."""
    return float(heads) * length * length * 4 * ATTENTION_SCORE_COPIES


@dataclass(frozen=True)
class Batching:
    """What the runtime batches by: the profile's limits, and a language model's KV pool as the plan sized it."""

    max_batch: int = field(metadata=bounds(1, 4096))
    max_batch_delay_ms: float = field(metadata=bounds(0, 1000))
    # The KV pool's bytes (builder/planning/memory.py kv_pool_bytes); MBUILD_KV_CACHE_MB overrides it. 0: every
    # slot's whole context (an encoder, or an engine written before the plan recorded it).
    kv_cache_bytes: int = field(default=0, metadata=bounds(0, 1 << 50))


@dataclass(frozen=True)
class EncoderOptions:
    embedding_dim: int = field(metadata=bounds(1, 1 << 20))  # the width of one pooled vector
    pooling: str
    normalize: bool
    # Instruction prefixes by name (sentence-transformers' prompts: Qwen3-Embedding's "query"), and the one a text
    # gets when a request names none.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    # Trained to be cut short (Matryoshka): `dimensions` may ask for a prefix of the vector, of any width below
    # embedding_dim, or of one of matryoshka_dims where the model names them.
    matryoshka: bool = False
    matryoshka_dims: tuple[int, ...] = ()

    def prompt(self, name: str | None) -> str:
        """The prefix for a text of this prompt name (the default's when None)."""
        chosen = name if name is not None else self.default_prompt
        return self.prompts.get(chosen, "") if chosen is not None else ""


@dataclass(frozen=True)
class RerankPrompt:
    """A decoder reranker's recipe (Qwen3-Reranker's): a pair is one text, `prefix` + `template` filled with the
    instruction, query and document + `suffix`, and its logit is the "yes" token's minus the "no" token's at the
    last position (so the sigmoid of it is the model card's p(yes) over the two)."""

    prefix: str
    template: str  # names {instruction}, {query} and {document}
    suffix: str
    instruction: str  # the card's default task instruction

    def text(self, query: str, document: str) -> str:
        # Values filled into the recipe's own template: braces in a user's text are never read as fields.
        return self.template.format(instruction=self.instruction, query=query, document=document)


@dataclass(frozen=True)
class RerankOptions:
    """A cross-encoder: a query and a passage in, the classification head's one logit out ("score").

    activation turns the logit into the relevance score the Cohere-shaped routes return, as sentence-transformers'
    CrossEncoder.predict does for the model (sigmoid unless its config names another). prompt: a decoder
    reranker's recipe; None for an encoder, whose tokenizer's own pair template joins query and passage."""

    activation: Literal["sigmoid", "identity"]
    prompt: RerankPrompt | None = None


@dataclass(frozen=True)
class LayerCache:
    """A layer whose KV cache is not the decoder's kv_heads x head_dim (a model whose global layers have heads of
    their own size, or whose sliding layers have more KV heads)."""

    layer: int = field(metadata=bounds(0, 1023))
    kv_heads: int = field(metadata=bounds(1, 1024))
    head_dim: int = field(metadata=bounds(1, 4096))


@dataclass(frozen=True)
class DecoderOptions:
    vocab_size: int = field(metadata=bounds(1, 1 << 24))  # logits per position
    # the layers that hold keys and values; 0 for a model of recurrent layers alone (its graph's states, which the
    # engine checks: runtimes/engines/states.py)
    layers: int = field(metadata=bounds(0, 1024))
    kv_heads: int = field(metadata=bounds(1, 1024))  # every layer's cache but those in layer_caches
    head_dim: int = field(metadata=bounds(1, 4096))
    eos_token_ids: tuple[int, ...]
    special_tokens: dict[str, str]  # what the chat template names (bos_token, eos_token)
    chat_template: str | None
    layer_caches: tuple[LayerCache, ...] = ()  # the layers whose cache differs; most models: none

    def __post_init__(self) -> None:
        named = [c.layer for c in self.layer_caches]
        if len(set(named)) != len(named) or any(layer >= self.layers for layer in named):
            raise ContractError(f"{ENGINE_FILE}: options.layer_caches names layers {named}, of {self.layers}")

    @property
    def cache_shapes(self) -> tuple[tuple[int, int], ...]:
        """Each layer's cache as (kv_heads, head_dim)."""
        shapes = [(self.kv_heads, self.head_dim)] * self.layers
        for cache in self.layer_caches:
            shapes[cache.layer] = (cache.kv_heads, cache.head_dim)
        return tuple(shapes)


@dataclass(frozen=True)
class OrtBuild:
    """How ONNX Runtime optimized the graph (the runtime loads it with optimization off)."""

    graph_optimization: str


Options = EncoderOptions | RerankOptions | DecoderOptions
OPTIONS: dict[str, type[EncoderOptions] | type[RerankOptions] | type[DecoderOptions]] = {
    "embedding": EncoderOptions, "rerank": RerankOptions, "text-generation": DecoderOptions}


@dataclass(frozen=True)
class EngineConfig:
    engine: Literal["onnxruntime", "tensorrt"]
    task: Task
    model_file: str
    tokenizer_file: str
    inputs: tuple[str, ...]
    output: str
    max_seq_length: int = field(metadata=bounds(1, 1 << 24))
    pad_token_id: int = field(metadata=bounds(0, 1 << 24))
    precision: str
    batching: Batching
    options: Options
    onnxruntime: OrtBuild | None = None
    attention_heads: int = field(default=0, metadata=bounds(0, 1 << 16))  # encoders: what attention_bytes takes
    # A pre-quantized checkpoint's format as published ("gptq int4 g128"; "" for an unquantized one), and whether
    # the engine's weights were rounded again from its decoded values (any precision but fp32)
    source_format: str = ""
    requantized: bool = False
    format: int = ENGINE_FORMAT

    @property
    def encoder(self) -> EncoderOptions:
        if not isinstance(self.options, EncoderOptions):
            raise ContractError(f"{ENGINE_FILE}: task {self.task!r} is not an embedding model")
        return self.options

    @property
    def reranker(self) -> RerankOptions:
        if not isinstance(self.options, RerankOptions):
            raise ContractError(f"{ENGINE_FILE}: task {self.task!r} is not a reranker")
        return self.options

    @property
    def decoder(self) -> DecoderOptions:
        if not isinstance(self.options, DecoderOptions):
            raise ContractError(f"{ENGINE_FILE}: task {self.task!r} is not a language model")
        return self.options

    def with_batching(self, batching: Batching) -> EngineConfig:
        return dataclasses.replace(self, batching=batching)

    @classmethod
    def from_dict(cls, raw: object) -> EngineConfig:
        check_format(raw, ENGINE_FILE, ENGINE_FORMAT)
        task = raw.get("task") if isinstance(raw, dict) else None
        if task not in OPTIONS:
            raise ContractError(f"{ENGINE_FILE}: task must be one of {', '.join(map(repr, OPTIONS))} (got {task!r})")
        return decode(cls, raw, ENGINE_FILE, types_={"options": OPTIONS[str(task)]})

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data
