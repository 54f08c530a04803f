"""Llama 2 and 3.x (transformers' modeling_llama.py): the layout the records' defaults are."""

from builder.model.family_record import Family

RECORD = Family("llama", "Llama 2, Llama 3.x")
