"""Facts derived from config.json fields (builder/model/shape.py) against the published sizes and against
transformers' own models: parameters (all experts, and the active ones), tied heads, sliding layers, checkpoints.

transformers builds each model on the meta device (shapes, no memory), so its parameter count is exact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
import transformers as tf

from builder.engine.rope import served_context
from builder.model.catalog import load_catalog
from builder.model.families import FAMILIES, WRAPPERS
from builder.model.shape import facts_from_config, text_config
from tests.support.family_configs import family_configs

# Billions, total and active, as the model cards and technical reports state them. Gemma 3 from 4B up: the text
# model's (the report's embedding + non-embedding parameters; the vision tower is not built). gpt-oss's card
# counts active parameters without the token table, which a decode step reads a row of: checked against that.
PUBLISHED: dict[str, tuple[float, float | None]] = {
    "llama-3.1-8b": (8.03, None), "llama-3.1-70b": (70.6, None), "llama-3.2-1b": (1.24, None),
    "llama-3.2-3b": (3.21, None), "mistral-7b": (7.25, None), "mixtral-8x7b": (46.7, 12.9),
    "qwen2.5-0.5b": (0.49, None), "qwen2.5-7b": (7.61, None),
    "qwen3-0.6b": (0.6, None), "qwen3-1.7b": (1.7, None), "qwen3-4b": (4.0, None), "qwen3-8b": (8.2, None),
    "qwen3-8b-fp8": (8.2, None), "qwen3-8b-awq": (8.2, None),
    "qwen3-14b": (14.8, None), "qwen3-32b": (32.8, None), "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "gemma-2-2b": (2.61, None), "gemma-2-9b": (9.24, None), "gemma-2-27b": (27.2, None),
    "gemma-3-1b": (1.0, None), "gemma-3-4b": (3.88, None), "gemma-3-12b": (11.77, None),
    "gemma-3-27b": (27.0, None),
    "phi-4-mini": (3.8, None), "phi-4": (14.7, None), "granite-3.3-2b": (2.53, None),
    "granite-3.3-8b": (8.17, None), "olmo-2-7b": (7.3, None), "olmo-2-13b": (13.7, None),
    "smollm3-3b": (3.08, None), "gpt-oss-20b": (20.9, 3.6), "gpt-oss-120b": (116.8, 5.1),
    # DeepSeek's cards: V3/R1 671B, 37B active (685B with the multi-token-prediction layer, not served); V2-Lite
    # 15.7B, 2.4B active without the token tables (as gpt-oss's); the distills their base models' sizes
    "deepseek-r1": (671.0, 37.0), "deepseek-v3": (671.0, 37.0), "deepseek-v2-lite": (15.7, 2.4),
    "deepseek-r1-distill-qwen-1.5b": (1.78, None), "deepseek-r1-distill-qwen-7b": (7.62, None),
    "deepseek-r1-distill-qwen-14b": (14.8, None), "deepseek-r1-distill-qwen-32b": (32.8, None),
    "deepseek-r1-distill-llama-8b": (8.03, None), "deepseek-r1-distill-llama-70b": (70.6, None),
}
# whose published active count leaves the token table out
WITHOUT_TABLE = {"gpt-oss-20b", "gpt-oss-120b", "deepseek-v2-lite"}
# What the Hub stores (GB): gpt-oss's MXFP4 experts are 4.25 bits a weight, the rest bf16.
STORED_GB = {"gpt-oss-20b": 13.8, "gpt-oss-120b": 65.3}
LANGUAGE_MODELS = {alias: entry for alias, entry in load_catalog().items()
                   if entry.config is not None and entry.task == "text-generation"}
# Decoder-body embedders: planned from their family's fields too, their served graph the body alone (no LM head).
EMBEDDERS = {alias: entry for alias, entry in load_catalog().items()
             if entry.config is not None and entry.task == "embedding"}


def on_meta(config: Any) -> Any:
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(config)


def transformers_count(config: Any) -> int:
    return sum(p.numel() for p in on_meta(config).parameters())  # a tied head is one tensor, counted once


def transformers_expert_layers(config: Any) -> tuple[int, ...]:
    layers = on_meta(config).model.layers
    return tuple(i for i, layer in enumerate(layers) if any(n.endswith("experts") for n, _ in layer.named_modules()))


def as_transformers(text: Mapping[str, Any]) -> Any:
    """rope_scaling is left out: it holds no weights, and the catalog records its kind without its factor lists."""
    fields = {k: v for k, v in text.items() if k not in ("model_type", "rope_scaling")}
    return tf.AutoConfig.for_model(str(text["model_type"]), **fields)


def test_every_catalog_language_model_has_a_published_size_to_check() -> None:
    assert set(LANGUAGE_MODELS) == set(PUBLISHED)


@pytest.mark.parametrize("alias", sorted(PUBLISHED))
def test_catalog_parameters_are_within_3_percent_of_the_published_ones(alias: str) -> None:
    facts = LANGUAGE_MODELS[alias].facts()
    total, active = PUBLISHED[alias]
    assert facts.params == pytest.approx(total, rel=0.03)
    if active is None:
        assert facts.active_params is None and facts.active == facts.params
    else:
        counted = facts.active - facts.table / 1e9 if alias in WITHOUT_TABLE else facts.active
        assert counted == pytest.approx(active, rel=0.03)
    if alias in STORED_GB:
        assert facts.download_gb == pytest.approx(STORED_GB[alias], rel=0.03)


@pytest.mark.parametrize("alias", sorted(LANGUAGE_MODELS))
def test_catalog_parameters_are_transformers_own_count(alias: str) -> None:
    """The recorded fields read as transformers reads them: a misnamed field would take its class default."""
    config = LANGUAGE_MODELS[alias].config or {}
    text, _ = text_config(config)
    assert LANGUAGE_MODELS[alias].facts().params * 1e9 == pytest.approx(transformers_count(as_transformers(text)),
                                                                        rel=0.001)


@pytest.mark.parametrize("alias", sorted(EMBEDDERS))
def test_catalog_embedders_count_the_body_transformers_builds(alias: str) -> None:
    config = as_transformers(text_config(EMBEDDERS[alias].config or {})[0])
    with torch.device("meta"):
        body = tf.AutoModel.from_config(config)  # what sentence-transformers loads: no LM head
    assert EMBEDDERS[alias].facts().params * 1e9 == pytest.approx(sum(p.numel() for p in body.parameters()),
                                                                  rel=0.001)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_familys_facts_follow_transformers(model_type: str) -> None:
    """The family matrix's configs, saved as config.json: at these tiny sizes norms and biases weigh ~1%."""
    config = family_configs()[model_type]
    saved = config.to_dict()
    facts = facts_from_config(saved, "text-generation")
    assert facts.family == model_type and facts.tied == config.tie_word_embeddings
    assert facts.context == served_context(config)  # what the export's engine serves (Phi-3's LongRoPE: less)
    assert facts.params * 1e9 == pytest.approx(transformers_count(config), rel=0.03)
    kinds = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    assert facts.sliding_layers == sum(k == "sliding_attention" for k in kinds) or (
        window and not kinds and facts.sliding_layers == config.num_hidden_layers)
    if FAMILIES[model_type].kind == "moe":
        assert facts.experts == (getattr(config, "num_local_experts", None) or config.num_experts)
        assert facts.experts_per_token == config.num_experts_per_tok
        assert facts.moe_layers == transformers_expert_layers(config)
        assert facts.active_params is not None and facts.active_params < facts.params


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_defaults_are_transformers_class_defaults(model_type: str) -> None:
    """What a config.json leaves out is read as the family's config class fills it in."""
    family, cls = FAMILIES[model_type], type(family_configs()[model_type])
    assert family.ties_head == cls().tie_word_embeddings
    if family.sliding_period:
        default = cls(num_hidden_layers=30, sliding_window=16)  # 30: periods 2 to 6 differ
        saved = {k: v for k, v in default.to_dict().items() if k not in ("layer_types", "_sliding_window_pattern")}
        kinds = default.layer_types
        assert facts_from_config(saved, "text-generation").sliding_layers == kinds.count("sliding_attention")


def test_a_wrappers_text_defaults_are_its_text_config_class_defaults() -> None:
    for wrapper in WRAPPERS.values():
        defaults = tf.AutoConfig.for_model(wrapper.text_family).to_dict()
        assert {k: defaults[k] for k in wrapper.text_defaults} == dict(wrapper.text_defaults)


def test_qwen3_moe_dense_layers_hold_no_experts() -> None:
    """mlp_only_layers and decoder_sparse_step keep some of Qwen3-MoE's layers dense."""
    config = family_configs()["qwen3_moe"]
    config.num_hidden_layers, config.mlp_only_layers, config.decoder_sparse_step = 4, [0], 2
    facts = facts_from_config(config.to_dict(), "text-generation")
    assert facts.moe_layers == (1, 3) == transformers_expert_layers(config)
    assert facts.params * 1e9 == pytest.approx(transformers_count(config), rel=0.03)


def test_a_longrope_config_json_written_before_transformers_5_is_served_to_its_original_length() -> None:
    """Phi-4-mini's config.json names its rope settings rope_scaling, its kind "type"."""
    config = {**family_configs()["phi3"].to_dict(), "max_position_embeddings": 131072,
              "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope"}}
    del config["rope_parameters"]
    assert facts_from_config(config, "text-generation").context == 4096
    assert LANGUAGE_MODELS["phi-4-mini"].facts().context == 4096
