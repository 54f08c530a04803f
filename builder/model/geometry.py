"""A decoder's attention geometry (layers, heads, KV heads, head width), which of its layers hold experts and the
context it is served to, from a transformers config object or a config.json dict: the one derivation planning
(shape.py) and the exports use."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.errors import UnsupportedModel
from builder.model.families import FAMILIES

# the cache's layer kinds that keep a recurrent state and no keys and values (transformers' cache_utils): planning
# counts no cache for them
STATE_ONLY = frozenset({"conv", "linear_attention"})
NO_KEYS = STATE_ONLY | {"dummy"}  # and a layer without attention (an MLP layer of its own) or that reuses another's

# where configs count a mixture-of-experts layer's routed experts
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# a mixture-of-experts layer's shared experts (every token runs them): a count of routed-width experts, or one width
SHARED_COUNTS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
SHARED_WIDTHS = ("shared_expert_intermediate_size", "shared_experts_intermediate_size",
                 "moe_shared_expert_intermediate_size")


@dataclass(frozen=True)
class HeadGeometry:
    layers: int
    heads: int
    kv_heads: int  # grouped-query attention: fewer key/value heads than query heads; MHA: all of them
    head_dim: int
    # each layer's cache (kv_heads, head_dim) where the layers' differ, kv_heads and head_dim then most layers';
    # empty where every layer's is (kv_heads, head_dim)
    layer_shapes: tuple[tuple[int, int], ...] = ()
    values_are_keys: bool = False  # multi-head latent attention's latent: one cache, held once as keys and values

    @classmethod
    def of_layers(cls, heads: int, shapes: Sequence[tuple[int, int]]) -> HeadGeometry:
        """The geometry of layers whose caches are `shapes`, (kv_heads, head_dim) a layer."""
        common = next((s for s, _ in Counter(shapes).most_common() if s[0]), (1, 1))  # a layer that holds keys
        mixed = tuple(shapes) if len(set(shapes)) > 1 else ()
        return cls(layers=len(shapes), heads=heads, kv_heads=common[0], head_dim=common[1], layer_shapes=mixed)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Each layer's cache as (kv_heads, head_dim)."""
        return self.layer_shapes or ((self.kv_heads, self.head_dim),) * self.layers

    @property
    def values_per_token(self) -> int:
        """The cache's values a token takes in one kind (its keys, or its values) over every layer."""
        return sum(heads * dim for heads, dim in self.shapes)

    def layer(self, i: int) -> HeadGeometry:
        """Layer i's own geometry, as one uniform layer's (what its attention node is written with)."""
        heads, dim = self.shapes[i]
        return HeadGeometry(layers=1, heads=self.heads, kv_heads=heads, head_dim=dim)


def _get(config: Mapping[str, Any] | Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def head_geometry(config: Mapping[str, Any] | Any) -> HeadGeometry:
    """kv_heads defaults to heads, head_dim to hidden_size / heads, as transformers' own models do. Multi-head
    latent attention (a kv_lora_rank) is cached as the generic export runs it (builder/engine/generic/latent.py):
    its latent and shared rotary key, kv_lora_rank + qk_rope_head_dim values a token, as one KV head (the same
    buffer bound as key and as value: runtimes/engines/decoder.py)."""
    if not isinstance(config, Mapping) and getattr(config, "is_heterogeneous", False):
        config = config.to_dict()  # its per-layer sizes read only through per_layer_config, as config.json has them
    kinds = [str(k) for k in _get(config, "layer_types") or ()]
    try:
        layers = int(_get(config, "num_hidden_layers"))
        if not _get(config, "num_attention_heads") and kinds and set(kinds) <= NO_KEYS:  # no attention at all
            return HeadGeometry(layers, 1, 1, 1, layer_shapes=((0, 1),) * layers)
        heads = int(_get(config, "num_attention_heads"))
        head_dim = int(_get(config, "head_dim") or int(_get(config, "hidden_size")) // heads)
        kv_heads = int(_get(config, "num_key_value_heads") or heads)
        if _get(config, "kv_lora_rank"):  # the latent and the shared rotary key, one "head" a token
            head_dim = int(_get(config, "kv_lora_rank")) + int(_get(config, "qk_rope_head_dim") or 0)
            return HeadGeometry(layers=layers, heads=heads, kv_heads=1, head_dim=head_dim, values_are_keys=True)
        shapes = [(kv_heads, head_dim)] * layers
        for i, layer in (_layer_overrides(config, layers) if isinstance(config, Mapping) else {}).items():
            shapes[i] = (int(_get(layer, "num_key_value_heads") or shapes[i][0]),
                         int(_get(layer, "head_dim") or shapes[i][1]))
        for i, kind in enumerate(kinds[:layers]):
            if kind in NO_KEYS:  # a recurrent layer (its state is per sequence, not per token), or none
                shapes[i] = (0, head_dim)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise UnsupportedModel(f"the model's config lacks a usable num_attention_heads, num_hidden_layers or "
                               f"hidden_size ({exc})") from exc
    return HeadGeometry.of_layers(heads, shapes) if layers > 0 else HeadGeometry(layers, heads, kv_heads, head_dim)


def _layer_overrides(config: Mapping[str, Any], layers: int) -> dict[int, Mapping[str, Any]]:
    """transformers' per_layer_config, a heterogeneous config's sizes that layers override: {layer: {field: value}}."""
    raw = config.get("per_layer_config")
    if not isinstance(raw, Mapping):
        return {}
    return {int(i): layer for i, layer in raw.items() if isinstance(layer, Mapping) and 0 <= int(i) < layers}


def expert_layers(config: Mapping[str, Any] | Any) -> tuple[int, ...]:
    """The layers whose feed-forward is a mixture of experts: all of a mixture-of-experts family's, but (as
    modeling_qwen3_moe does) those in mlp_only_layers and all but every decoder_sparse_step-th one."""
    family = FAMILIES.get(str(_get(config, "model_type")))
    experts = next((n for name in EXPERT_COUNTS if isinstance(n := _get(config, name), int) and n > 1), 0)
    if (family is not None and family.kind != "moe") or not experts:
        return ()
    try:
        layers = int(_get(config, "num_hidden_layers"))
        dense = {int(i) for i in _get(config, "mlp_only_layers") or ()}
        dense |= set(range(int(_get(config, "first_k_dense_replace") or 0)))  # DeepSeek's first dense layers
        step = int(_get(config, "decoder_sparse_step") or 1)
    except (TypeError, ValueError) as exc:
        raise UnsupportedModel(f"the model's config has no usable num_hidden_layers, mlp_only_layers or "
                               f"decoder_sparse_step ({exc})") from exc
    return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)


def model_context(config: Mapping[str, Any] | Any) -> int:
    """The longest sequence an engine serves: max_position_embeddings, but LongRoPE's (Phi-3 128k, Phi-4-mini)
    original_max_position_embeddings, past which its long factors would need tables rebuilt (engine/rope.py).
    transformers 5 names the rope settings rope_parameters, config.json files before it rope_scaling."""
    rope = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    entries = [v for v in rope.values() if isinstance(v, Mapping)] or [rope]  # Gemma 3: one a layer type
    try:
        if any((e.get("rope_type") or e.get("type")) == "longrope" for e in entries):
            return int(_get(config, "original_max_position_embeddings") or rope["original_max_position_embeddings"])
        return int(_get(config, "max_position_embeddings") or 2048)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModel(f"the model's config has no usable max_position_embeddings or LongRoPE "
                               f"original_max_position_embeddings ({exc})") from exc
