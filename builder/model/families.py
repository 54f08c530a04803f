"""The decoder families mbuild builds, by transformers' `model_type`: the one list the export, planning, the
refusal of other models and docs/models.md read.

A family here is one the streamed export (builder/engine/decoder_graph.py) writes and the family test matrix
(tests/unit/test_decoder_families.py) checks against transformers; a test keeps the two equal.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from builder.errors import UnsupportedModel


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type
    label: str  # what users call it
    kind: Literal["dense", "moe"] = "dense"


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "Llama 2, Llama 3.x"),
    Family("mistral", "Mistral"),
    Family("qwen2", "Qwen2, Qwen2.5"),
    Family("qwen3", "Qwen3"),
    Family("gemma2", "Gemma 2"),
    Family("gemma3_text", "Gemma 3 (text)"),
    Family("phi3", "Phi-3, Phi-4, Phi-4-mini"),
    Family("granite", "Granite 3.x"),
    Family("olmo2", "OLMo 2"),
    Family("smollm3", "SmolLM3"),
    Family("mixtral", "Mixtral", "moe"),
    Family("qwen3_moe", "Qwen3-MoE", "moe"),
    Family("gpt_oss", "gpt-oss", "moe"),
)}


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
