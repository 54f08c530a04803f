"""Qwen2 and Qwen2.5 (modeling_qwen2.py): Llama's layers with q/k/v biases, which the checkpoint carries."""

from builder.model.family_record import Family

RECORD = Family("qwen2", "Qwen2, Qwen2.5")
