"""Granite 3.x (modeling_granite.py): the attention scaled by attention_multiplier, each residual branch by
residual_multiplier (the embedding and logits scales are read from the model: engine/family_glue.py)."""

from builder.model.family_record import Family, Layers

RECORD = Family("granite", "Granite 3.x", layers=Layers(attn_scale="value", attn_scale_field="attention_multiplier",
                                                        residual_scale_field="residual_multiplier"))
