"""Tiny configs of any transformers model type, by one set of rules (no table per family): the class's defaults
with every size shrunk, for the generic export's sweep (tests/integration/test_model_sweep.py).

Rules: the standard head geometry (4 query heads of 16, hidden 64, the class's query heads per KV head);
every other integer field named like a size (size, dim, rank, intermediate) above 64 becomes 64 or 32;
counts of experts 4 (2 a token), of layers as few as show every kind of layer its per-layer lists name (at
least 2); windows and chunks 16 tokens, so the gate's sequences cross them; token ids inside the vocabulary.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 512, 64, 4, 2, 16, 16
STANDARD = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2,
            "pad_token_id": 0, "tie_word_embeddings": False}
SIZE = re.compile(r"(size|_dim|dim_|rank|intermediate|hidden)", re.I)
WINDOWS = re.compile(r"(window|attention_chunk)", re.I)
EXPERTS = re.compile(r"^(num_local_experts|num_experts|n_routed_experts|moe_num_experts|num_experts_total)$")
PER_TOKEN = re.compile(r"^(num_experts_per_tok|experts_per_token|moe_k|top_k|num_experts_per_token|moe_topk)$")
GROUPS = re.compile(r"^(n_group|topk_group|num_expert_group)$")


def _layers(defaults: dict[str, Any], count: int) -> tuple[int, dict[str, Any]]:
    """How many layers keep every kind a per-layer list names, and those lists cut to it."""
    lists = {k: v for k, v in defaults.items() if isinstance(v, list) and len(v) == count and count > 1}
    keep = 2
    for values in lists.values():
        seen: dict[str, int] = {}
        for i, value in enumerate(values):
            seen.setdefault(repr(value), i)
        keep = max(keep, max(seen.values()) + 1)
    return keep, {k: v[:keep] for k, v in lists.items()}


def _shrunk(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if EXPERTS.match(name) and value > 1:
        return 4
    if PER_TOKEN.match(name) and value > 1:
        return 2
    if GROUPS.match(name) and value > 1:
        return 2 if name != "topk_group" else 1
    if WINDOWS.search(name) and value > WINDOW:
        return WINDOW
    if name.endswith("_token_id") and value >= VOCAB:
        return 3
    if SIZE.search(name) and value > HIDDEN:
        return HIDDEN if "intermediate" in name else 32
    return value


def _tiny(defaults: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The rules on one config's fields (a nested sub-config, text or vision, by the same rules)."""
    layers_key = names.get("num_hidden_layers", "num_hidden_layers")
    count = int(defaults.get(layers_key) or 2) if isinstance(defaults.get(layers_key), int) else 2
    keep, lists = _layers(defaults, count)
    values = {k: _shrunk(k, v) for k, v in defaults.items() if not isinstance(v, (dict, list))}
    values.update(lists)
    values.update({k: _tiny(v, {}) for k, v in defaults.items() if isinstance(v, dict) and _is_config(k, v)})
    for standard, value in STANDARD.items():
        name = names.get(standard, standard)
        if name in defaults and (standard != "head_dim" or _derived_head_dim(defaults, names)):
            values[name] = value
    heads, kv = (defaults.get(names.get(k, k)) for k in ("num_attention_heads", "num_key_value_heads"))
    if isinstance(heads, int) and isinstance(kv, int) and 0 < kv <= heads:  # the class's grouping, kept
        values[names.get("num_key_value_heads", "num_key_value_heads")] = max(1, HEADS * kv // heads)
    if layers_key in defaults:
        values[layers_key] = keep
    values.pop("transformers_version", None)
    return values


def _derived_head_dim(defaults: dict[str, Any], names: dict[str, str]) -> bool:
    """Whether head_dim is hidden / heads (or unset): a free size. Where it is not (MLA's rope width), the size
    rule shrinks it with the fields it must equal."""
    head_dim = defaults.get(names.get("head_dim", "head_dim"))
    hidden = defaults.get(names.get("hidden_size", "hidden_size"))
    heads = defaults.get(names.get("num_attention_heads", "num_attention_heads"))
    return not head_dim or (isinstance(hidden, int) and isinstance(heads, int) and heads > 0
                            and head_dim == hidden // heads)


def _is_config(name: str, value: dict[str, Any]) -> bool:
    return name.endswith("_config") or "model_type" in value


def tiny_config(model_type: str) -> Any:
    """The tiny config; raises whatever the class raises when these sizes do not fit its rules."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    values = _tiny(cls().to_dict(), dict(getattr(cls, "attribute_map", {})))
    if dataclasses.is_dataclass(cls):  # what the class derives itself (DeepSeek's qk_head_dim) is not passed
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        values = {k: v for k, v in values.items() if k in fields}
    return cls(**values)
