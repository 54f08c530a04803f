"""Rotary embedding tables for GroupQueryAttention's cos_cache/sin_cache, from the model's own rotary class.

transformers computes the inverse frequencies (Llama 3, YaRN, linear scaling, Gemma 3's per-layer-type bases)
and the attention scaling; this module only tabulates them per position. A table keyed "default" serves every
layer of most families; Gemma 3 has one per layer type.
LongRoPE (Phi-3 128k, Phi-4-mini) switches to its long factors once a sequence passes
original_max_position_embeddings, which a table per position cannot express: such models are served up to
that length, with the short factors, exactly as transformers runs them there (served_context).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from builder.errors import UnsupportedModel
from builder.model.geometry import model_context

# Rope variants whose frequencies change with the sequence length would need the cache rebuilt at run time.
STATIC_ROPE = {"default", "linear", "llama3", "yarn", "proportional"}
ROTARY_MULTIPLE = 16  # GroupQueryAttention (CPU) rotates a multiple of 8 pairs of each head


def _rope_types(config: Any) -> list[str]:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    nested = [v for v in rope.values() if isinstance(v, dict)]  # Gemma 3: one entry per layer type
    return [str(p.get("rope_type", "default")) for p in (nested or [rope])]


def served_context(config: Any) -> int:
    """The longest sequence the tables serve exactly: the model's, or LongRoPE's original length (the rule planning
    reads too: geometry.model_context)."""
    return model_context(config)


def _rotary(config: Any) -> Any:
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    # the causal LM class's own module: Gemma 3's text model lives in models/gemma3, not models/gemma3_text
    module = importlib.import_module(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__module__)
    rotary_class = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return rotary_class(config)


def rotary_tables(config: Any, head_dim: int, keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """key -> (cos, sin) [served_context, rotary_dim/2]; key "default" is the model's single table."""
    for kind in _rope_types(config):
        if kind not in STATIC_ROPE | {"longrope"}:
            raise UnsupportedModel(f"rope type {kind!r} changes with the sequence length; it is not supported yet")
    rotary = _rotary(config)
    positions = np.arange(served_context(config), dtype=np.float32)
    tables = {}
    for key in keys:
        prefix = "" if key == "default" else f"{key}_"
        inv_freq = getattr(rotary, f"{prefix}inv_freq").float().numpy()
        if 2 * len(inv_freq) > head_dim or (2 * len(inv_freq)) % ROTARY_MULTIPLE:
            raise UnsupportedModel(f"a rotary width of {2 * len(inv_freq)} of {head_dim} per head is not supported "
                                   f"(ONNX Runtime rotates a multiple of {ROTARY_MULTIPLE}, at most the whole head)")
        angles = np.outer(positions, inv_freq)
        scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        tables[key] = ((np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32))
    return tables
