"""What a family record (builder/model/families/) says: the facts its transformers modeling_*.py fixes and a
config.json does not, which the graph writer (engine/decoder_family.py), the mixture-of-experts writer
(engine/decoder_moe.py), planning (model/shape.py, geometry.py) and the reranker recipes read instead of testing
a family's name. Every default is Llama's: a record names only where its family differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtimes.bundle.engine import RerankPrompt


@dataclass(frozen=True)
class Layers:
    """How a family's decoder layers differ from Llama's, as its modeling_*.py writes them."""

    # which RMSNorms a layer has: before attention and MLP (Llama), also after each (Gemma 2/3's sandwich), or
    # only after each (OLMo 2)
    norms: Literal["pre", "sandwich", "post"] = "pre"
    norm_offset: float = 0.0  # added to every norm weight: Gemma's RMSNorm scales by (1 + w)
    qk_norm: Literal["head", "all"] | None = None  # q/k RMSNorm per head (Qwen3) or over all heads (OLMo 2)
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # under self_attn, fused into one MatMul
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")  # under mlp: gate then up (Phi-3 stores one [gate; up])
    # the attention's scale: head_dim^-0.5, or the config field's value^-0.5 (Gemma's query_pre_attn_scalar), or
    # the field's value itself (Granite's attention_multiplier)
    attn_scale: Literal["head_dim", "inverse_sqrt", "value"] = "head_dim"
    attn_scale_field: str = ""
    residual_scale_field: str = ""  # the config field each residual branch is multiplied by (Granite's)
    rope_layers_field: str = ""  # the config field, per layer, that is 0 where a layer has no rope (SmolLM3's)
    sinks: bool = False  # a learned per-head logit each softmax also normalises over (gpt-oss)


@dataclass(frozen=True)
class Experts:
    """Where a family's checkpoint keeps a layer's experts (names under model.layers.{i}) and how it routes them."""

    block: str  # the feed-forward module holding router and experts
    router: str  # the router's module under the block
    count_field: str  # the config field: experts per layer
    inter_field: str  # the config field: each expert's intermediate size
    # under the block: split, gate, up and down per expert ({e}); fused, gate_up and down for all experts at once
    weights: tuple[str, ...]
    fused: bool = False  # [E, H, 2I] and [E, I, H] tensors, gate and up interleaved (MXFP4 blocks when *_blocks)
    normalize_field: str = ""  # the config field whose truth renormalises the top-k weights ("": always)
    # silu(gate) * up, or gpt-oss's (up + 1) * gate * sigmoid(swiglu_alpha * gate), clamped at swiglu_limit
    gating: Literal["silu", "clamped_swiglu"] = "silu"


@dataclass(frozen=True)
class Family:
    """A decoder family by transformers' model_type: beside its name, what a config.json may leave out for
    transformers' class defaults to fill in, and, for the fast lane's, how its graph is written."""

    model_type: str  # transformers' config.model_type
    label: str  # what users call it
    kind: Literal["dense", "moe"] = "dense"
    ties_head: bool = False  # tie_word_embeddings when config.json omits it
    sliding_period: int = 0  # without layer_types: every period-th layer is global, the rest slide (0: all slide)
    layers: Layers = field(default_factory=Layers)
    experts: Experts | None = None  # a "moe" family's expert layout
    rerank: RerankPrompt | None = None  # the prompt recipe of rerankers on this body (their model card's)


@dataclass(frozen=True)
class Wrapper:
    """A multimodal wrapper around a family's text model: its config.json's text_config is text_family's. Its text
    model is sized from that (the catalog's Gemma 3 4B and up); it is built once the export reads the text model
    out of the wrapper's checkpoint (text_config, the language_model.* weights), and refused when planned until
    then."""

    model_type: str  # the wrapper's own config.model_type
    text_family: str
    # transformers' text config class defaults, which a wrapper's text_config leaves out where it equals them
    text_defaults: Mapping[str, Any]
    built: bool = False  # the export reads this wrapper's text model (builder/engine/export_decoder.py)
