"""The decoder families mbuild builds, by transformers' `model_type`: the one list the export, planning, the
refusal of other models and docs/models.md read.

A family here is one the streamed export (builder/engine/decoder_graph.py) writes and the family test matrix
(tests/support/family_configs.py) checks against transformers (tests/unit/test_decoder_graph.py); a test keeps the
two equal (tests/unit/test_models_doc.py).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from builder.errors import UnsupportedModel


@dataclass(frozen=True)
class Family:
    """Beside its name, what a config.json may leave out for transformers' class defaults to fill in."""

    model_type: str  # transformers' config.model_type
    label: str  # what users call it
    kind: Literal["dense", "moe"] = "dense"
    ties_head: bool = False  # tie_word_embeddings when config.json omits it
    sliding_period: int = 0  # without layer_types: every period-th layer is global, the rest slide (0: all slide)
    generic: bool = False  # built by the generic export (builder/model/generic.py), not by hand


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "Llama 2, Llama 3.x"),
    Family("mistral", "Mistral"),
    Family("qwen2", "Qwen2, Qwen2.5"),
    Family("qwen3", "Qwen3"),
    Family("gemma2", "Gemma 2", ties_head=True, sliding_period=2),
    Family("gemma3_text", "Gemma 3 (text)", ties_head=True, sliding_period=6),
    Family("phi3", "Phi-3, Phi-4, Phi-4-mini"),
    Family("granite", "Granite 3.x"),
    Family("olmo2", "OLMo 2"),
    Family("smollm3", "SmolLM3", ties_head=True),
    Family("mixtral", "Mixtral", "moe"),
    Family("qwen3_moe", "Qwen3-MoE", "moe"),
    Family("gpt_oss", "gpt-oss", "moe", sliding_period=2),
)}

@dataclass(frozen=True)
class Wrapper:
    """A multimodal wrapper around a family's text model: its config.json's text_config is text_family's. Its text
    model is sized from that (the catalog's Gemma 3 4B and up); it is built once the export reads the text model
    out of the wrapper's checkpoint (text_config, the language_model.* weights), and refused when planned until
    then."""

    text_family: str
    # transformers' text config class defaults, which a wrapper's text_config leaves out where it equals them
    text_defaults: Mapping[str, Any]
    built: bool = False  # the export reads this wrapper's text model (builder/engine/export_decoder.py)


# Any other wrapper (a config.json with a text_config inside) is refused by name.
WRAPPERS: dict[str, Wrapper] = {
    "gemma3": Wrapper("gemma3_text", {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                                      "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                                      "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096}),
}


def fast_lane(model_type: str | None) -> bool:
    """Whether a language model's graph is written by hand (decoder_graph.py) rather than traced from
    transformers' modeling code (builder/engine/generic/)."""
    return str(model_type or "") in FAMILIES


def export_path(model_type: str) -> str:
    """Which export builds a language model, and why, in one line: what `mbuild plan` and `package` say."""
    if fast_lane(model_type):
        return f"fast lane: mbuild's hand-written graph for {model_type!r} (builder/engine/decoder_graph.py)"
    return (f"generic: traced from transformers' own {model_type!r} modeling code, as no hand-written graph "
            "exists for it (builder/engine/generic/)")


def family(model_type: str | None) -> Family:
    """The family of a config's model_type, or the refusal that names it, the list and the nearest one."""
    name = str(model_type or "")
    found = FAMILIES.get(name)
    if found is not None:
        return found
    nearest = difflib.get_close_matches(name, list(FAMILIES), n=1, cutoff=0.4)
    near = f"; the nearest is {nearest[0]!r}, but a family is built only when its own layers are" if nearest else ""
    raise UnsupportedModel(f"language models of type {name or '(none)'!r} are not supported",
                           hint=f"supported families: {', '.join(sorted(FAMILIES))}{near}; see docs/models.md")


def wrapped_family(model_type: str, text_model_type: str | None) -> tuple[Family, Wrapper]:
    """The family a multimodal wrapper's text model is built as, or the refusal that names the wrapper."""
    wrapper = WRAPPERS.get(model_type)
    if wrapper is None or (text_model_type or wrapper.text_family) != wrapper.text_family:
        raise UnsupportedModel(
            f"multimodal models of type {model_type!r} (a {text_model_type or 'text'!r} model with other inputs) "
            "are not supported",
            hint=f"mbuild builds text-only models of the families {', '.join(sorted(FAMILIES))} and the text "
                 f"model of {', '.join(sorted(WRAPPERS))}; see docs/models.md")
    return FAMILIES[wrapper.text_family], wrapper


def require_built(wrapper: str, repo: str) -> None:
    """The refusal, before any download, of a known wrapper whose text model the export does not read yet."""
    known = WRAPPERS[wrapper]
    if not known.built:
        raise UnsupportedModel(
            f"{repo} is a multimodal {wrapper!r} model (a {known.text_family!r} text model with a vision tower); "
            "mbuild does not build the text model out of a multimodal checkpoint yet",
            hint=f"text-only {known.text_family} checkpoints are built (a repo or folder whose config.json has "
                 f"model_type {known.text_family!r}); see docs/models.md")
