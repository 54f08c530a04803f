"""Gemma 3's text model (modeling_gemma3.py): Gemma 2's layers with per-head q/k norms, five sliding layers to
each global one."""

from dataclasses import replace

from builder.model.families.gemma2 import LAYERS
from builder.model.family_record import Family

RECORD = Family("gemma3_text", "Gemma 3 (text)", ties_head=True, sliding_period=6,
                layers=replace(LAYERS, qk_norm="head"))
