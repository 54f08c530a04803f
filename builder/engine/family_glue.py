"""What a decoder family's top-level model does around its layers, read once from the model and its config.

mbuild runs transformers' decoder layers itself (reference.py one at a time, decoder_torch.py around an explicit
cache), so the layers bring the family's attention and MLP (q/k norms, soft-capping, sinks, biases, experts,
layers without rope), and only what *Model.forward and *ForCausalLM.forward add around them is replicated,
here, for both: the embedding scale (Gemma's sqrt(hidden), Granite's embedding_multiplier), each layer's rotary
table (Gemma 3 keeps one per layer type) and attention window, and the logits' scaling (Granite divides by
logits_scaling, Gemma 2 soft-caps). The tests hold both users to transformers' own forward and generate.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

FULL = "full_attention"


def attention_window(config: Any, layer: int) -> int:
    """A layer's sliding window, -1 for full attention. Families with layer_types slide their
    sliding_attention layers; the others (Mistral, Phi-3, Mixtral, Qwen3-MoE) slide every layer whenever the
    config sets sliding_window, as their *Model.forward picks the sliding mask then (their configs null it
    when use_sliding_window is off)."""
    size = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if size and (kinds is None or kinds[layer] == "sliding_attention"):
        return int(size)
    return -1


def _windows(config: Any, layers: int) -> tuple[int | None, ...]:
    """Per layer, the sliding window or None."""
    return tuple(w if (w := attention_window(config, i)) > 0 else None for i in range(layers))


@dataclass(frozen=True)
class FamilyGlue:
    embed_scale: float
    layer_types: tuple[str, ...]  # the key of each layer's rotary table
    windows: tuple[int | None, ...]
    rotary_per_type: bool  # the rotary module takes the layer type (Gemma 3's local and global bases)
    logits_divisor: float
    final_softcap: float | None

    @classmethod
    def of_config(cls, config: Any) -> FamilyGlue:
        """From a config alone: the model planned on the meta device, which allocates nothing."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            return cls.of(AutoModelForCausalLM.from_config(config))

    @classmethod
    def of(cls, model: Any) -> FamilyGlue:
        """From a *ForCausalLM (on the meta device is enough: only attributes are read)."""
        config, inner = model.config, model.model
        kinds = list(getattr(config, "layer_types", None) or [FULL] * config.num_hidden_layers)
        # Gemma's scaled embedding module keeps its scale as a float; Granite's model multiplies in its forward
        scale = float(getattr(inner.embed_tokens, "scalar_embed_scale", 1.0))
        scale *= float(getattr(inner, "embedding_multiplier", 1.0))
        per_type = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
        cap = getattr(config, "final_logit_softcapping", None)
        return cls(embed_scale=scale, layer_types=tuple(kinds), windows=_windows(config, len(kinds)),
                   rotary_per_type=per_type, logits_divisor=float(getattr(config, "logits_scaling", 1.0)),
                   final_softcap=float(cap) if cap else None)

    def embedded(self, rows: torch.Tensor) -> torch.Tensor:
        return rows * self.embed_scale if self.embed_scale != 1.0 else rows

    def rotations(self, rotary: Any, x: torch.Tensor, positions: torch.Tensor,
                  traced: bool = False) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) for each layer type, from the model's own rotary module. `traced` calls its forward under
        transformers' dynamic_rope_update: that update (LongRoPE's long factors, dynamic NTK's growth) changes
        the tables only past the context an engine serves (rope.served_context), and its in-place copy into
        the frequency buffer cannot be exported."""
        forward = getattr(type(rotary).forward, "__wrapped__", None) if traced else None
        call = rotary if forward is None else lambda *args: forward(rotary, *args)
        if self.rotary_per_type:
            return {kind: call(x, positions, kind) for kind in sorted(set(self.layer_types))}
        table = call(x, positions)
        return {kind: table for kind in set(self.layer_types)}

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.logits_divisor != 1.0:
            logits = logits / self.logits_divisor
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def attention_bias(query_pos: torch.Tensor, key_pos: torch.Tensor, valid: torch.Tensor, window: int | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [B, 1, Q, K] eager attention adds: a key is seen when valid, not after the query and,
    on a sliding layer, less than `window` positions before it (transformers' sliding_window_overlay)."""
    query, key = query_pos.unsqueeze(-1), key_pos.unsqueeze(1)
    allowed = (key <= query) & valid.bool().unsqueeze(1)
    if window is not None:
        allowed = allowed & (key > query - window)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    return torch.where(allowed, torch.zeros((), dtype=dtype), blocked).unsqueeze(1)
