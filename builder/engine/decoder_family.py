"""How a decoder family's layers differ from Llama's, read once from its record and its transformers config.

The graph writer (decoder_graph.py) follows an Arch and knows no family names; neither does this module: the
family's record (builder/model/families/, family_record.Layers) says what its modeling_*.py in transformers does
(norms and their offset, q/k norms, fused projections, which config fields scale the attention and the residual,
which layers have no rope, sinks), and the config gives the values:
  soft caps   the attention logits' (Gemma 2): cap * tanh(x / cap)
  layers      each layer's rope table (none on a no-rope layer) and whether its feed-forward is a
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
from builder.model.family_record import Layers
from builder.model.geometry import expert_layers

NORMS = {  # a record's norms layout: its tensors before and after attention, before and after the MLP
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
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


def _rope(config: Any, facts: Layers, glue: FamilyGlue, layer: int) -> str | None:
    if facts.rope_layers_field and not getattr(config, facts.rope_layers_field)[layer]:
        return None
    return glue.layer_types[layer] if glue.rotary_per_type else DEFAULT_ROPE


def _activation(config: Any) -> Literal["silu", "gelu_tanh"]:
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if name == "silu":
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise UnsupportedModel(f"activation {name!r} is not supported yet (silu and gelu_pytorch_tanh are)")


def _attn_scale(config: Any, facts: Layers, head_dim: int) -> float:
    if facts.attn_scale == "inverse_sqrt":
        return float(getattr(config, facts.attn_scale_field)) ** -0.5
    if facts.attn_scale == "value":
        return float(getattr(config, facts.attn_scale_field))
    return float(head_dim ** -0.5)


def arch_of(config: Any) -> Arch:
    kind = str(config.model_type)
    facts = family(kind).layers  # refuses a family mbuild does not build, naming the ones it does
    glue = FamilyGlue.of_config(config)  # what the model does around its layers, as reference.py reads it
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return Arch(
        model_type=kind,
        norms=Norms(*NORMS[facts.norms]),
        norm_offset=facts.norm_offset,
        eps=float(config.rms_norm_eps),
        qkv=facts.qkv,
        gate_up=facts.gate_up,
        qk_norm=facts.qk_norm,
        activation=_activation(config),
        embed_scale=glue.embed_scale,
        attn_scale=_attn_scale(config, facts, head_dim),
        attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        final_softcap=glue.final_softcap or 0.0,
        residual_scale=float(getattr(config, facts.residual_scale_field)) if facts.residual_scale_field else 1.0,
        logits_scale=1.0 / glue.logits_divisor,
        sinks=facts.sinks,
        layers=tuple(LayerPlan(glue.windows[i] or -1, _rope(config, facts, glue, i), sparse_layer(config, i))
                     for i in range(int(config.num_hidden_layers))),
    )
