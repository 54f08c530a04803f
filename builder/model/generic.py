"""What planning knows of a language model without a fast lane: transformers' own config class, read from
config.json alone, before any download.

Such a model is built by the generic export (builder/engine/generic/) when transformers can run it as a causal
LM. Its config.json is read through its config class: the class's attribute_map gives the standard names
(GPT-2's n_embd is hidden_size) and its defaults fill what the file leaves out. What the generic export
cannot build is refused here, by rules on the config that hold for every family: an encoder-decoder, attention
its config says is not causal, layers that keep a recurrent state outside transformers' Cache, a model that
keeps no cache at all. One whose code computes attention itself is traced whole over a grown cache
(computes_attention_itself), as is one whose layers keep a recurrent state in that Cache (engine/generic/states.py).
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Mapping
from functools import cache
from typing import Any

from builder.errors import UnsupportedModel
from builder.model.families import Family, family, fast_lane
from builder.model.geometry import EXPERT_COUNTS, STATE_ONLY
from builder.model.measured import export_refusal
from builder.model.torch_free import torch_free

# layer_types entries that attend over a KV cache as mbuild's attention does (causal, maybe windowed); not Llama 4's
# chunked_attention, which attends within fixed blocks of the sequence, not over the last tokens
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "attention"})
# what keeps a per-sequence state instead of (or beside) a KV cache: a layer type, or a config field sizing it
RECURRENT_KIND = re.compile(r"(linear|conv|mamba|ssm|hybrid|recurrent|rnn|lstm|mlp)", re.I)
RECURRENT_FIELD = re.compile(r"^(mamba_|ssm_|linear_conv|linear_num|linear_key|linear_value|linear_attn|state_size$|"
                             r"conv_L_cache$|conv_kernel$|conv1d_width$|lru_width$|block_types$|n_recurrent|"
                             r"hybrid_override_pattern$|hybrid_layer_ids$|time_step_)")
# the sizes planning reads, which a config class may derive rather than store
DERIVED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
           "intermediate_size", "vocab_size", "max_position_embeddings")
HINT = "see docs/models.md for the model types mbuild builds and why the others are refused"


@cache
def causal_lm_types() -> frozenset[str]:
    """Every model_type transformers maps to a causal LM class (imports PyTorch: see is_causal_lm)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@cache
def _config_class(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


@cache
def _defaults(model_type: str) -> dict[str, Any]:
    try:
        return dict(_config_class(model_type)().to_dict())
    except Exception:  # a class that cannot be made without arguments offers no defaults
        return {}


def standard_config(model_type: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json under transformers' standard names, the class's defaults beneath what the file says."""
    cls = _config_class(model_type)
    merged = {**_defaults(model_type), **config}
    for standard, own in getattr(cls, "attribute_map", {}).items():
        if own in merged and standard not in config:
            merged[standard] = merged[own]
    missing = [name for name in DERIVED if merged.get(name) is None]
    # a class whose layers override its sizes (per_layer_config) derives them from the file's own fields
    layered = "per_layer_config" in _defaults(model_type) and "per_layer_config" not in config
    if missing or layered:  # a size the class derives (LongCat-Flash's num_hidden_layers is 2 x num_layers)
        try:
            made = _made(model_type, config)
        except Exception:  # a config.json its own class refuses: the fields it has are what planning reads
            return merged
        merged.update({name: getattr(made, name) for name in missing if getattr(made, name, None) is not None})
        if layered:
            merged["per_layer_config"] = made.to_dict().get("per_layer_config") or {}
    return merged


def refusal(model_type: str, config: Mapping[str, Any]) -> str | None:
    """Why the generic export cannot build this model, in one line; None where it can try."""
    if model_type not in causal_lm_types():
        return f"transformers {_version()} has no causal language model of type {model_type or '(none)'!r}"
    if config.get("is_encoder_decoder") or _defaults(model_type).get("is_encoder_decoder") \
            or config.get("add_cross_attention") or "cross_attention_hidden_size" in config:
        # a *ForCausalLM of an encoder-decoder family (BART's decoder) saves is_encoder_decoder false; a decoder
        # made to attend to an encoder's states (a vision encoder-decoder's text decoder, TrOCR's) says so by
        # cross-attention, switched on or sized by its config class
        return "an encoder-decoder model or its decoder (mbuild serves decoder-only language models)"
    if config.get("causal") is False:  # a masked language model that transformers also maps as a causal LM
        return ("its config says its attention is not causal (\"causal\": false): each token attends to the tokens "
                "after it too, which a language model's cache cannot serve")
    kinds = sorted({str(k) for k in config.get("layer_types") or ()} - ATTENTION_LAYERS)
    state = sorted({k for k in kinds if RECURRENT_KIND.search(k)} | {k for k in config if RECURRENT_FIELD.match(k)})
    if (state or not config.get("num_attention_heads")) and not keeps_state_in_cache(model_type):
        what = f"a hybrid with recurrent layers ({', '.join(state[:3])})" if config.get("num_attention_heads") \
            else "no attention layers: a recurrent model"
        return (f"{what}, whose modeling code keeps its per-sequence state outside transformers' Cache, where "
                "mbuild's export finds the states it carries (builder/engine/generic/states.py)")
    # a state layer's kind is the state form's; "moe" and "mlp" name layers without attention (transformers' cache
    # gives them no cache: its get_layer_types_and_kwargs)
    kinds = [k for k in kinds if not RECURRENT_KIND.search(k) and k != "moe"]
    if kinds:
        return (f"attention of kinds mbuild's attention does not compute ({', '.join(kinds)}): it attends causally, "
                "over the whole context or a window")
    if computes_attention_itself(model_type) and not _keeps_cache(model_type):
        return ("its modeling code keeps no KV cache (it recomputes every past token each step), which mbuild's "
                "engines serve a sequence from")
    return None


def computes_attention_itself(model_type: str) -> bool:
    """Whether the type's modeling code computes attention itself, not through transformers' attention interface
    (where the generic export puts the runtime's in-place attention): such a model is traced whole over a grown
    cache instead (builder/engine/generic/grown.py)."""
    return not _attention_interface(model_type)


def keeps_state_in_cache(model_type: str) -> bool:
    """Whether the type's modeling code keeps a recurrent state in transformers' Cache (its linear-attention
    layers' conv and recurrent states), which the generic export carries as graph inputs and outputs. True where
    the module cannot be read here: the export decides."""
    source = _modeling_source(model_type)
    return source is None or "update_recurrent_state" in source or "update_conv_state" in source


def _keeps_cache(model_type: str) -> bool:
    """Whether the type's modeling module uses transformers' Cache (its layers hand keys and values to it), which
    the grown-cache graph is traced through. True where the module cannot be read here: the export decides."""
    source = _modeling_source(model_type)
    return source is None or "cache_utils" in source


def _attention_interface(model_type: str) -> bool:
    """Whether the type's causal LM runs attention through transformers' attention interface: its class says so
    (`_supports_attention_backend`, the mark vLLM's Transformers backend reads), or its modeling module looks the
    function up in ALL_ATTENTION_FUNCTIONS (some that do lack the mark: StableLM, BioGPT). True where the module
    cannot be read here: the export, which traces it, then decides."""
    source = _modeling_source(model_type)
    return source is None or _marked(model_type) or "ALL_ATTENTION_FUNCTIONS" in source


def _causal_lm_class(model_type: str) -> Any:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def _marked(model_type: str) -> bool:
    return bool(getattr(_causal_lm_class(model_type), "_supports_attention_backend", False))


@cache
def _modeling_source(model_type: str) -> str | None:
    """The source of the module the type's causal LM class is in; None where it cannot be read (ImportError
    without PyTorch, a class this transformers cannot load, no source file)."""
    try:
        return inspect.getsource(sys.modules[_causal_lm_class(model_type).__module__])
    except Exception:
        return None


def _version() -> str:
    import transformers

    return str(transformers.__version__)


@torch_free
def _reading(model_type: str, config: dict[str, Any], wrapper: str = "") -> dict[str, Any]:
    """What transformers says of a config.json, in one child process: whether it has a causal LM of the type (of
    the wrapper's, for a text_config), the config under standard names (None where it has no config class for the
    type) and the generic export's refusal."""
    if (wrapper or model_type) not in causal_lm_types():
        return {"causal": False, "config": None}
    try:
        standard = standard_config(model_type, config)
    except KeyError:
        return {"causal": True, "config": None}
    refused = refusal(model_type, standard) or export_refusal(model_type, _version())
    kinds = None if refused else _cache_layer_types(model_type, config)
    if kinds and set(kinds) & STATE_ONLY:  # the layers that keep a state and no keys: planning counts no cache
        standard["layer_types"] = kinds
    return {"causal": True, "config": standard, "refusal": refused}


def _made(model_type: str, config: Mapping[str, Any]) -> Any:
    """The config class made from config.json's fields, as from_pretrained reads the file (a float JSON cannot
    hold, Mamba's infinite time_step_limit, is written {"__float__": "Infinity"})."""
    cls = _config_class(model_type)
    return cls.from_dict(cls._decode_special_floats({k: v for k, v in config.items() if k != "model_type"}))


def _cache_layer_types(model_type: str, config: Mapping[str, Any]) -> list[str] | None:
    """Each layer's kind as transformers' cache builds it (full_attention, conv, linear_attention, hybrid, ...);
    None where the config class or the cache cannot say."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        made = _made(model_type, config)
        return [str(kind) for kind in get_layer_types_and_kwargs(made.get_text_config(decoder=True))[0]]
    except Exception:  # a config its class refuses, or a cache that cannot read it
        return None


def is_causal_lm(config: Mapping[str, Any]) -> bool:
    """Whether transformers runs config.json's model_type as a causal LM."""
    return bool(_reading(str(config.get("model_type") or ""), dict(config))["causal"])


def generic_family(model_type: str, config: Mapping[str, Any],
                   wrapper: str = "") -> tuple[Mapping[str, Any], Family] | None:
    """config.json under standard names and the record planning reads for a model the generic export builds, or its
    refusal; None where transformers has no causal LM of the type (or the wrapper's) or no config class for it."""
    read = _reading(model_type, dict(config), wrapper)
    standard = read["config"]
    if standard is None:
        return None
    if read["refusal"]:
        raise UnsupportedModel(f"language models of type {model_type!r} are not supported: {read['refusal']}",
                               hint=HINT)
    moe = any(isinstance(standard.get(k), int) and standard.get(k, 0) > 1 for k in EXPERT_COUNTS)
    return standard, Family(model_type, model_type, "moe" if moe else "dense")  # config holds the class's tie default


def language_family(text: Mapping[str, Any]) -> tuple[Mapping[str, Any], Family]:
    """A language model's config (standard names for a generic one) and its family: the fast lane's record, or
    the generic export's, or the refusal that says why neither builds it."""
    kind = str(text.get("model_type") or "")
    if fast_lane(kind):
        return text, family(kind)
    found = generic_family(kind, text)
    return found or (text, family(kind))  # family(): the refusal that names the families and the nearest


def wrapped_text(model_type: str, inner: Mapping[str, Any]) -> tuple[Mapping[str, Any], Family] | None:
    """A multimodal checkpoint without a record whose type transformers runs as a causal LM (its forward takes text
    alone): its language model, planned from text_config under standard names, which the generic export traces
    through the wrapper's own forward. None where transformers has no causal LM of that type."""
    text_type = str(inner.get("model_type") or "")
    return generic_family(text_type, inner, model_type) if text_type else None
