"""Gemma 3 from 4B up (modeling_gemma3.py's Gemma3ForConditionalGeneration): a vision tower around a gemma3_text
model, whose text_config leaves out what equals Gemma3TextConfig's defaults (these)."""

from builder.model.family_record import Wrapper

RECORD = Wrapper("gemma3", "gemma3_text", {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "sliding_window": 4096}, built=True)
