"""Mistral (modeling_mistral.py): Llama's layers; every layer slides when the config sets sliding_window."""

from builder.model.family_record import Family

RECORD = Family("mistral", "Mistral")
