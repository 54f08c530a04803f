"""Qwen3-MoE (modeling_qwen3_moe.py): Qwen3's attention; experts per expert under mlp, renormalised when
norm_topk_prob is set (dense layers: geometry.expert_layers)."""

from builder.model.family_record import Experts, Family, Layers

RECORD = Family("qwen3_moe", "Qwen3-MoE", "moe", layers=Layers(qk_norm="head"), experts=Experts(
    "mlp", "gate", "num_experts", "moe_intermediate_size",
    ("experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight", "experts.{e}.down_proj.weight"),
    normalize_field="norm_topk_prob"))
