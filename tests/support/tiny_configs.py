"""Tiny configs of any transformers model type, by one set of rules (no table per family): the class's defaults
with every size shrunk, for the generic export's sweep (tests/integration/test_model_sweep.py).

Rules:
- heads: the standard geometry (4 query heads, hidden 64); every other count of attention heads (key/value, a
  decoder's, an indexer's) scales as the query heads do, so the class's grouping holds. A state-space mixer's
  heads are recounted so heads x head width = expand x hidden still holds, its groups at most its heads.
- parts of a head (head_dim, rotary and rope widths, latent attention's q/k/v parts) shrink together: where
  head_dim is hidden / heads (or unset) that width becomes 16 and a rotary width keeps its ratio to it; the others,
  where one is above 64, all divide by the one power of two that brings the largest to 32, so sums and splits hold.
- every other integer field named like a size (size, dim, rank, width, intermediate) above 64 becomes 64 or 32, in
  per-layer lists too.
- experts 4 (2 a token), also where the class leaves them unset, with 1 shared expert where that is unset.
- layers: every count of all of them (the total, an encoder's, a decoder's) as few as show every kind of layer
  its per-layer lists name (at least 2), or a pattern they cycle through, or a kind every n layers from o; lists
  of (kinds, repeats) repeated once; a count of some of them (shared, dense, input layers) keeps its share;
  settings keyed by layer index kept for the layers kept, shrunk alike.
- windows and chunks 16 tokens, so the gate's sequences cross them; token ids inside the vocabulary, and every
  other vocabulary (a per-layer embedding table's) the tiny one, so each table takes every token id.
- an encoder architecture (a class with is_decoder) is made a decoder, as its *ForCausalLM asks to be.
- what the class derives itself is not passed (a field it does not take) or passed unset again (a layer count, or
  a width equal to the hidden size, that it defaults to None); nested parameters that are not configs (rope
  parameters) are left to the class's defaults.
"""

from __future__ import annotations

import dataclasses
import re
from itertools import product
from typing import Any, TypeGuard

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WINDOW, PART = 512, 64, 4, 2, 16, 16, 32
STANDARD = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
            "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "tie_word_embeddings": False}
SIZE = re.compile(r"(size|_dim|dim_|rank|intermediate|hidden|width)", re.I)
HEAD_PART = re.compile(r"(head_dim|^d_head|rotary_dim|rope_dim)$")
HEAD_COUNT = re.compile(r"(attention_heads|key_value_heads|kv_heads|kv_n_heads|index_n_heads|^n_heads?|^num_heads)$")
LAYERS = re.compile(r"^(num_hidden_layers|num_layers|n_layers?|(num_)?(encoder|decoder)_layers)$")
SOME_LAYERS = re.compile(r"^(num|n|max)_\w+_layers$")
WINDOWS = re.compile(r"(window|attention_chunk)", re.I)
EXPERTS = re.compile(r"^(num_local_experts|num_experts|n_routed_experts|moe_num_experts|num_experts_total)$")
PER_TOKEN = re.compile(r"^(num_experts_per_tok|experts_per_token|moe_k|top_k|num_experts_per_token|moe_topk)$")
SHARED = re.compile(r"^(n_shared_experts|num_shared_experts)$")
GROUPS = re.compile(r"^(n_group|topk_group|num_expert_group)$")


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _repeats(value: Any) -> int | None:
    """The layers a list of (kinds, repeats) pairs spans (attention_types = [[["global", "local"], 12]])."""
    if not isinstance(value, list) or not value:
        return None
    pairs = [p for p in value if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], list)
             and _count(p[1])]
    return sum(len(kinds) * n for kinds, n in pairs) if len(pairs) == len(value) else None


def _by_layer(value: Any) -> bool:
    """Settings keyed by layer index ({"2": {...}, "3": {...}})."""
    return isinstance(value, dict) and bool(value) and all(
        str(k).isdigit() and isinstance(v, dict) for k, v in value.items())


def _layers(defaults: dict[str, Any], counts: set[int]) -> tuple[int, dict[str, Any]]:
    """How many layers keep every kind a per-layer list names, and those lists cut to it."""
    lists = {k: v for k, v in defaults.items() if isinstance(v, list) and len(v) in counts and len(v) > 1}
    keep = 2
    for values in lists.values():
        seen: dict[str, int] = {}
        for i, value in enumerate(values):
            seen.setdefault(repr(value), i)
        keep = max(keep, max(seen.values()) + 1)
    for name, value in defaults.items():  # a pattern the layers cycle through, or a layer kind every n from o
        if name.endswith("_types") and isinstance(value, list) and 1 < len(value) < min(counts, default=0):
            keep = max(keep, len(value))
        if name.endswith("_offset") and _count(value) and _count(defaults.get(name[:-len("offset")] + "period")):
            keep = max(keep, value + 1)
    runs = {k: [[kinds, 1] for kinds, _ in v] for k, v in defaults.items() if _repeats(v) in counts}
    keep = max([keep] + [sum(len(kinds) for kinds, _ in v) for v in runs.values()])
    cut = {k: [_shrunk(k, x) for x in v[:keep]] for k, v in lists.items() if k not in runs}
    return keep, cut | runs


def _shrunk(name: str, value: Any) -> Any:
    if not _count(value):
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
    if "vocab" in name and value > VOCAB:  # a second table by token id (per-layer embeddings) takes every id
        return VOCAB
    if SIZE.search(name) and value > HIDDEN:
        return HIDDEN if "intermediate" in name else 32
    return value


def _head_parts(defaults: dict[str, Any], width: int | None, derived: set[str], widest: int) -> dict[str, int]:
    """head_dim and the widths that split or sum to a head, shrunk together; `width` is hidden / heads, `widest`
    the widest part some layer's own settings name (those shrink by the same factor)."""
    parts = {k: v for k, v in defaults.items() if HEAD_PART.search(k) and _count(v) and v > 0 and k not in derived}
    head_dim = next((v for k, v in parts.items() if k in ("head_dim", "d_head")), None)
    shrunk: dict[str, int] = {}
    if width and (head_dim is None or head_dim == width):  # a free head width: 16, a rotary part in its ratio
        shrunk = {k: HEAD_DIM if k in ("head_dim", "d_head") else max(2, round(v * HEAD_DIM / width / 2) * 2)
                  for k, v in parts.items() if not k.endswith("head_dim") or k == "head_dim"}
        shrunk |= {"head_dim": HEAD_DIM} if "head_dim" in defaults else {}
    parts = {k: v for k, v in parts.items() if k not in shrunk}
    factor = 1
    largest = max([widest, *parts.values()])
    while parts and largest > HIDDEN and largest // factor > PART:
        factor *= 2
    return shrunk | {k: max(1, v // factor) for k, v in parts.items()}


def _heads(defaults: dict[str, Any], key: Any) -> dict[str, int]:
    """Every count of attention heads as the query heads scale; key/value heads the class leaves unset: 2."""
    heads, kv = defaults.get(key("num_attention_heads")), key("num_key_value_heads")
    values = {key("num_key_value_heads"): KV_HEADS} if kv in defaults and defaults[kv] is None else {}
    if _count(heads) and heads > 0:
        values.update({k: max(1, HEADS * v // heads) for k, v in defaults.items() if HEAD_COUNT.search(k)
                       and k != key("num_attention_heads") and _count(v)})
    return values


def _mixer_heads(defaults: dict[str, Any], values: dict[str, Any], hidden: Any) -> dict[str, int]:
    """A state-space mixer's heads, where heads x head width = expand x hidden: recounted so it still holds."""
    def named(pattern: str) -> dict[str, int]:
        return {k: v for k, v in defaults.items() if re.search(pattern, k) and _count(v) and v > 0}

    out = {}
    for (n, heads), (w, width), (e, expand) in product(named(r"heads$").items(), named(r"(d_head|head_?dim)$").items(),
                                                       named(r"expand$").items()):
        if _count(hidden) and heads * width == expand * hidden:
            out[n] = max(1, values.get(e, expand) * HIDDEN // values.get(w, width))
            out.update({g: min(v, out[n]) for g, v in named(r"n_groups$").items()})  # groups divide the heads
    return out


def _unset(defaults: dict[str, Any], unset: set[str], hidden: Any) -> dict[str, Any]:
    """Expert counts the class leaves unset (its MoE layers need them); a width it derives as the hidden size's,
    unset again so it derives it from the tiny one."""
    values: dict[str, Any] = {}
    for name, value in defaults.items():
        if value is None and (EXPERTS.match(name) or PER_TOKEN.match(name)):
            values[name] = _shrunk(name, 1 << 10)
        if value is None and SHARED.match(name):
            values[name] = 1
        if name in unset and _count(hidden) and value == hidden and SIZE.search(name):
            values[name] = None
    return values


def _layer_counts(defaults: dict[str, Any], totals: set[str], keep: int, unset: set[str]) -> dict[str, Any]:
    """The totals `keep`; a count of some of the layers its share; one the class derives, unset again."""
    values: dict[str, Any] = {k: keep for k in totals}
    total = max((defaults[k] for k in totals), default=0)
    for name, value in defaults.items():
        if SOME_LAYERS.match(name) and name not in totals and _count(value) and 0 < value <= total:
            values[name] = keep if value == total else max(1, round(value * keep / total))
        if name in unset and name not in totals and (name.endswith("_layers") or name.startswith("num_layers")):
            values[name] = None
    return values


def _tiny(defaults: dict[str, Any], names: dict[str, str], unset: set[str], derived: set[str],
          widest: int = 0) -> dict[str, Any]:
    """The rules on one config's fields (a nested sub-config, text or vision, by the same rules)."""
    def key(standard: str) -> str:
        return names.get(standard, standard)

    totals = {k for k, v in defaults.items() if (LAYERS.match(k) or k == key("num_hidden_layers")) and _count(v)}
    keep, lists = _layers(defaults, {defaults[k] for k in totals if defaults[k] > 1})
    values = {k: _shrunk(k, v) for k, v in defaults.items() if not isinstance(v, (dict, list))}
    values.update(lists)
    values.update({k: _tiny(v, {}, set(), set()) for k, v in defaults.items()
                   if isinstance(v, dict) and _is_config(k, v)})
    hidden, heads = defaults.get(key("hidden_size")), defaults.get(key("num_attention_heads"))
    width = hidden // heads if _count(hidden) and _count(heads) and heads > 0 else None
    layers = {k: v for k, v in defaults.items() if _by_layer(v)}
    widest = max([widest] + [v for entries in layers.values() for entry in entries.values()
                             for k, v in entry.items() if HEAD_PART.search(k) and _count(v)])
    values.update(_head_parts(defaults, width, derived, widest))
    values.update({key(k): v for k, v in STANDARD.items() if key(k) in defaults})
    values.update(_heads(defaults, key))
    values.update(_mixer_heads(defaults, values, hidden))
    values.update(_unset(defaults, unset, hidden))
    values.update(_layer_counts(defaults, totals, keep, unset))
    flat = {k: v for k, v in defaults.items() if k not in layers}
    for name, by_layer in layers.items():  # each kept layer's settings, shrunk as the whole config's are
        values[name] = {i: {k: _tiny({**flat, **entry}, names, set(), derived, widest)[k] for k in entry}
                        for i, entry in by_layer.items() if int(i) < keep}
    values.pop("transformers_version", None)
    return values


def _is_config(name: str, value: dict[str, Any]) -> bool:
    return (name.endswith("_config") or "model_type" in value) and not _by_layer(value)


def tiny_config(model_type: str) -> Any:
    """The tiny config; raises whatever the class raises when these sizes do not fit its rules."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else {}
    unset = {k for k, f in fields.items() if f.default is None}
    # what the class derives (DeepSeek's qk_head_dim) is not passed; settings by layer are (Dots's per_layer_config)
    derived = {k for k in defaults if k not in fields and not _by_layer(defaults[k])} if fields else set()
    values = _tiny(defaults, dict(getattr(cls, "attribute_map", {})), unset, derived)
    if "is_decoder" in defaults:  # an encoder architecture run as a causal LM: transformers asks for is_decoder
        values["is_decoder"] = True
    return cls(**{k: v for k, v in values.items() if k not in derived})
