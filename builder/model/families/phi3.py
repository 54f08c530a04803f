"""Phi-3, Phi-4 and Phi-4-mini (modeling_phi3.py): q, k and v stored as one qkv_proj, gate and up as one
gate_up_proj."""

from builder.model.family_record import Family, Layers

RECORD = Family("phi3", "Phi-3, Phi-4, Phi-4-mini", layers=Layers(qkv=("qkv_proj",), gate_up=("gate_up_proj",)))
