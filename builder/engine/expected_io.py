"""The engine inputs an export will produce, known from the model's facts alone (for --plan-only)."""

from __future__ import annotations

from builder.engine.exported import ExportShape
from builder.model.catalog import ModelFacts
from builder.model.geometry import HeadGeometry
from runtimes.bundle.engine import ENCODER_TASKS


def expected_export(facts: ModelFacts) -> ExportShape:
    """The shape export_encoder/export_decoder would give, without exporting."""
    if facts.task in ENCODER_TASKS:
        return ExportShape(("input_ids", "attention_mask", "token_type_ids"), facts.context, None)
    past = [f"past.{i}.{kind}" for i in range(facts.layers) for kind in ("key", "value")]
    return ExportShape(("input_ids", "attention_mask", "position_ids", "logits_at", *past), facts.context,
                       HeadGeometry(facts.layers, facts.heads, facts.kv_heads, facts.head_dim, facts.layer_caches))
