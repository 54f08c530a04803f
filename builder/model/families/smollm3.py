"""SmolLM3 (modeling_smollm3.py): a tied head, and layers without rope where no_rope_layers holds 0."""

from builder.model.family_record import Family, Layers

RECORD = Family("smollm3", "SmolLM3", ties_head=True, layers=Layers(rope_layers_field="no_rope_layers"))
