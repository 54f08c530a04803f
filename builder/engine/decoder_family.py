"""How a decoder family's layers differ from Llama's, read once from its transformers config.

The graph writer (decoder_graph.py) follows an Arch and knows no family names; this module is the one place
that does. Each fact is what the family's modeling_*.py in transformers does:
  norms       which RMSNorms a layer has and where: before attention and MLP (Llama), also after each
              (Gemma 2/3's sandwich), or only after each (OLMo 2); Gemma stores (1 + w) as w
  q/k norms   per head (Qwen3, Gemma 3, Qwen3-MoE) or over all heads at once (OLMo 2)
  scales      Gemma's query_pre_attn_scalar; Granite's attention and residual multipliers
  soft caps   Gemma 2's attention logits: cap * tanh(x / cap)
  layers      each layer's rope table (none on SmolLM3's no-rope layers) and whether its feed-forward is a
              mixture of experts
What the model does around its layers (embedding scale, windows, per-type rope tables, the logits' scaling and
soft cap) comes from family_glue.py, which reference.py and decoder_torch.py read too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from builder.engine.family_glue import FamilyGlue
from builder.errors import UnsupportedModel
from builder.model.families import family
from builder.model.geometry import expert_layers

GEMMA = {"gemma2", "gemma3_text"}
HEAD_QK_NORM = {"qwen3", "gemma3_text", "qwen3_moe"}
SANDWICH = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
PRE_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)
POST_NORMS = (None, "post_attention_layernorm", None, "post_feedforward_layernorm")
DEFAULT_ROPE = "default"


@dataclass(frozen=True)
class Norms:
    """A layer's norm tensors (names under model.layers.{i}), None where the family has none."""

    attn_in: str | None
    attn_out: str | None
    mlp_in: str | None
    mlp_out: str | None


@dataclass(frozen=True)
class LayerPlan:
    window: int  # GroupQueryAttention's local_window_size: -1 attends to the whole context
    rope: str | None  # the key of its rotary table (rope.py), None for a layer without rope
    moe: bool


@dataclass(frozen=True)
class Arch:
    model_type: str
    norms: Norms
    norm_offset: float  # added to every norm weight: Gemma's RMSNorm scales by (1 + w)
    eps: float
    qkv: tuple[str, ...]  # projection names under self_attn, fused into one MatMul
    gate_up: tuple[str, ...]  # under mlp: gate then up (fused Phi-3 stores one [gate; up] weight)
    qk_norm: Literal["head", "all"] | None
    activation: Literal["silu", "gelu_tanh"]
    embed_scale: float
    attn_scale: float
    attn_softcap: float  # 0: none
    final_softcap: float
    residual_scale: float
    logits_scale: float
    sinks: bool  # gpt-oss: a learned per-head logit each softmax also normalises over
    layers: tuple[LayerPlan, ...]

    def rope_keys(self) -> list[str]:
        return sorted({layer.rope for layer in self.layers if layer.rope is not None})


def sparse_layer(config: Any, layer: int) -> bool:
    """Whether a layer's feed-forward is a mixture of experts (geometry.expert_layers, which planning reads too)."""
    return layer in expert_layers(config)


def _rope(config: Any, glue: FamilyGlue, layer: int) -> str | None:
    if config.model_type == "smollm3" and not config.no_rope_layers[layer]:
        return None
    return glue.layer_types[layer] if glue.rotary_per_type else DEFAULT_ROPE


def _activation(config: Any) -> Literal["silu", "gelu_tanh"]:
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if name == "silu":
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise UnsupportedModel(f"activation {name!r} is not supported yet (silu and gelu_pytorch_tanh are)")


def arch_of(config: Any) -> Arch:
    kind = str(config.model_type)
    family(kind)  # refuses a family mbuild does not build, naming the ones it does
    glue = FamilyGlue.of_config(config)  # what the model does around its layers, as reference.py reads it
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    norms = Norms(*SANDWICH) if kind in GEMMA else Norms(*POST_NORMS) if kind == "olmo2" else Norms(*PRE_NORMS)
    granite = kind == "granite"
    attn_scale = head_dim ** -0.5
    if kind in GEMMA:
        attn_scale = float(config.query_pre_attn_scalar) ** -0.5
    elif granite:
        attn_scale = float(config.attention_multiplier)
    return Arch(
        model_type=kind,
        norms=norms,
        norm_offset=1.0 if kind in GEMMA else 0.0,
        eps=float(config.rms_norm_eps),
        qkv=("qkv_proj",) if kind == "phi3" else ("q_proj", "k_proj", "v_proj"),
        gate_up=("gate_up_proj",) if kind == "phi3" else ("gate_proj", "up_proj"),
        qk_norm="head" if kind in HEAD_QK_NORM else "all" if kind == "olmo2" else None,
        activation=_activation(config),
        embed_scale=glue.embed_scale,
        attn_scale=attn_scale,
        attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        final_softcap=glue.final_softcap or 0.0,
        residual_scale=float(config.residual_multiplier) if granite else 1.0,
        logits_scale=1.0 / glue.logits_divisor,
        sinks=kind == "gpt_oss",
        layers=tuple(LayerPlan(glue.windows[i] or -1, _rope(config, glue, i), sparse_layer(config, i))
                     for i in range(int(config.num_hidden_layers))),
    )
