"""Gemma 2 (modeling_gemma2.py): sandwich norms that scale by (1 + w), the attention scaled by
query_pre_attn_scalar, a tied head, and every other layer sliding when the config has no layer_types."""

from builder.model.family_record import Family, Layers

LAYERS = Layers(norms="sandwich", norm_offset=1.0, attn_scale="inverse_sqrt", attn_scale_field="query_pre_attn_scalar")

RECORD = Family("gemma2", "Gemma 2", ties_head=True, sliding_period=2, layers=LAYERS)
