"""The engine inputs an export will produce, known from the model's facts alone (for --plan-only)."""

from __future__ import annotations

from typing import Any

from builder.model.catalog import ModelFacts


def expected_export(facts: ModelFacts) -> dict[str, Any]:
    """The engine.json fields export_encoder/export_decoder would write, without exporting."""
    if facts.task == "embedding":
        return {"inputs": ["input_ids", "attention_mask", "token_type_ids"], "max_seq_length": facts.context,
                "options": {}}
    past = [f"past.{i}.{kind}" for i in range(facts.layers) for kind in ("key", "value")]
    return {"inputs": ["input_ids", "attention_mask", "position_ids", *past], "max_seq_length": facts.context,
            "options": {"kv_heads": facts.kv_heads, "head_dim": facts.head_dim, "layers": facts.layers}}
