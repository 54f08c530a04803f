"""What transformers' decoder layers need to be traced into the grown-cache graph (decoder_torch.py).

A cache: every family's attention module (transformers 5) calls cache.update(keys, values, layer_idx, ...)
after its projections, norms and rope, and attends over what it returns. GrownCache appends the new keys and
values to the graph's past inputs there and keeps the results as its present outputs, so the attention
itself (scaling, soft-capping, sinks, q/k norms, biases) stays transformers'.

Experts: torch.onnx's tracer (dynamo=False) records one run, so transformers' eager experts, which loop over
the experts the example tokens happened to pick, would bake that pick into the graph. transformers' own
loop-free "batched_mm" gathers each (token, expert) pair's weights, [tokens * top_k, 2I, H] in memory, more
than the model for a long prefill; dense_experts instead runs every expert on every token and weights the
unselected ones zero (one batched MatMul per projection, [E, tokens, 2I] in memory): E / top_k times the
expert FLOPs, the price of a static graph. It is registered in transformers' experts interface, so the
module's own weights, layout flags (transposed, biased) and gate (_apply_gate: Mixtral's SiLU, gpt-oss's
clamped SwiGLU) are used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

DENSE_EXPERTS = "mbuild_dense"


class GrownCache:
    """Past keys and values per layer in (past[2 i], past[2 i + 1]); the grown ones out in `present`."""

    def __init__(self, past: Sequence[torch.Tensor]) -> None:
        self.past = past
        self.present: list[torch.Tensor] = list(past)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        grown = (torch.cat([self.past[2 * layer_idx], keys], dim=2),
                 torch.cat([self.past[2 * layer_idx + 1], values], dim=2))
        self.present[2 * layer_idx:2 * layer_idx + 2] = grown
        return grown


def dense_experts(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    """Every expert on every token [T, H], summed with the router's weights (zero where not selected)."""
    x = hidden_states.unsqueeze(0)  # [1, T, H], broadcast over the experts
    up = self.gate_up_proj if self.has_gate else self.up_proj
    out = x @ (up if self.is_transposed else up.transpose(1, 2))  # [E, T, 2I]
    if self.has_bias:
        out = out + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unsqueeze(1)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = out @ (self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2))  # [E, T, H]
    if self.has_bias:
        out = out + self.down_proj_bias.unsqueeze(1)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    experts = torch.arange(out.shape[0], device=out.device)
    chosen = (top_k_index.unsqueeze(-1) == experts).to(out.dtype)  # [T, k, E]
    weights = (chosen * top_k_weights.to(out.dtype).unsqueeze(-1)).sum(dim=1)  # [T, E]
    return (out * weights.transpose(0, 1).unsqueeze(-1)).sum(dim=0).to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(DENSE_EXPERTS, dense_experts)
