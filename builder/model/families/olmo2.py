"""OLMo 2 (modeling_olmo2.py): norms after attention and MLP only, and q/k norms over all heads at once."""

from builder.model.family_record import Family, Layers

RECORD = Family("olmo2", "OLMo 2", layers=Layers(norms="post", qk_norm="all"))
