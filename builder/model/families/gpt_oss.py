"""gpt-oss (modeling_gpt_oss.py): attention sinks, every other layer sliding; experts fused into [E, H, 2I] and
[E, I, H] tensors with biases (MXFP4 blocks as published), a router with a bias, and a clamped SwiGLU."""

from builder.model.family_record import Experts, Family, Layers

RECORD = Family("gpt_oss", "gpt-oss", "moe", sliding_period=2, layers=Layers(sinks=True), experts=Experts(
    "mlp", "router", "num_local_experts", "intermediate_size", ("experts.gate_up_proj", "experts.down_proj"),
    fused=True, gating="clamped_swiglu"))
