"""Mixtral (modeling_mixtral.py): Mistral's attention; experts w1 (gate), w3 (up), w2 (down) per expert under
block_sparse_moe, the top-k weights always renormalised."""

from builder.model.family_record import Experts, Family

RECORD = Family("mixtral", "Mixtral", "moe", experts=Experts(
    "block_sparse_moe", "gate", "num_local_experts", "intermediate_size",
    ("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight")))
