"""Multi-head latent attention (DeepSeek-V2/V3's MLA) over its latent: the cache holds, per token and layer, the
kv_lora_rank latent and the one shared rotary key (512 + 64 = 576 values for DeepSeek-V3), not every head's key
and value (128 heads x 192 + 128 for DeepSeek-V3).

transformers' MLA attention (DeepSeek-V2/V3's and the families built on their modeling code) expands the latent
per head in its `expand_kv(kv_nope, k_rot)`, between its cache update and attention. Here the modeling code runs
as written up to there (its q projections, norms and rotary, whatever variant); `expand_kv` is replaced during the
trace by one that keeps the normalized latent and the roped shared key for the attention interface and expands
nothing, and kv_b_proj is absorbed instead, as DeepSeek's own inference does:
  scores:  q_nope . (W_UK c) = (q_nope W_UK) . c    -> the query becomes [q_nope W_UK, q_rope], 576 wide
  values:  softmax . (W_UV c) = W_UV (softmax . c)  -> the output is the attention over the latent, times W_UV
so the runtime's attention runs with one KV head of 576 (keys and values both the cache's entries; the output's
latent part is taken) and the placeholder ABSORB multiplies by each head's W_UK or W_UV, read from kv_b_proj's
weight. ONNX Runtime has no MLA kernel and transformers no absorbed MLA: this is what both lack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from onnx.defs import OpSchema, register_schema
from onnxscript.values import Op, Opset

from builder.engine.generic import ops

ABSORB = "Absorb"
register_schema(OpSchema(ABSORB, ops.DOMAIN, 1, inputs=[OpSchema.FormalParameter("x", "F")],
                         outputs=[OpSchema.FormalParameter("y", "F")], type_constraints=[("F", ["tensor(float)"], "")],
                         attributes=[OpSchema.Attribute(n, OpSchema.AttrType.INT, "")
                                     for n in ("key", "part", "nope")]))
_ABSORB = Op(Opset(ops.DOMAIN, 1), ABSORB)


@torch.library.custom_op("mbuild_trace::absorb", mutates_args=())
def absorb(x: torch.Tensor, key: int, part: int, nope: int, width: int) -> torch.Tensor:
    """x [B, H, S, D] times each head's part of kv_b_proj (key, nope: its key part's width per head): part 0
    W_UK ([H, nope, rank]), 1 W_UV ([H, rank, v])."""
    return x.new_zeros((*x.shape[:-1], width))


@absorb.register_fake
def _(x: torch.Tensor, key: int, part: int, nope: int, width: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], width))


def _absorb_node(x: Any, key: int, part: int, nope: int, width: int) -> Any:
    return _ABSORB(x, key=key, part=part, nope=nope)


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {torch.ops.mbuild_trace.absorb.default: _absorb_node}


LATENT = "_mbuild_latent"  # where a module's (kv_nope, k_rot) of the step being traced is kept


def watch(model: Any) -> list[Any]:
    """Every MLA attention module's expand_kv replaced by one that keeps its inputs and expands nothing; the
    modules, for `unwatch`."""
    found = []
    for module in model.modules():
        if callable(getattr(module, "expand_kv", None)) and hasattr(module, "kv_b_proj"):
            module.expand_kv = _keeper(module)
            found.append(module)
    return found


def unwatch(modules: list[Any]) -> None:
    for module in modules:
        del module.expand_kv  # the class's own again
        module.__dict__.pop(LATENT, None)


def _keeper(module: Any) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def expand_kv(kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        module.__dict__[LATENT] = (kv_nope, k_rot)
        batch, _, length, _ = kv_nope.shape
        heads, nope, rope = int(module.num_heads), int(module.qk_nope_head_dim), int(module.qk_rope_head_dim)
        # stand-ins of the expanded shapes, which the attention interface does not read
        return (kv_nope.new_zeros(batch, heads, length, nope + rope),
                kv_nope.new_zeros(batch, heads, length, int(module.v_head_dim)))
    return expand_kv


def latent_of(module: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    found: tuple[torch.Tensor, torch.Tensor] | None = getattr(module, "__dict__", {}).get(LATENT)
    return found


def inputs(module: Any, query: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor],
           key_of: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query [B, H, S, rank + rope], cache entries [B, 1, S, rank + rope]) for the runtime's attention."""
    nope, rank = int(module.qk_nope_head_dim), int(module.kv_lora_rank)
    entries = torch.cat(kept, dim=-1)
    return torch.cat([absorb(query[..., :nope], key_of, 0, nope, rank), query[..., nope:]], dim=-1), entries


def output(module: Any, out: torch.Tensor, key_of: int) -> torch.Tensor:
    """The attention's [B, S, H, rank + rope] output to the heads' values [B, S, H, v]."""
    latent = out[..., :int(module.kv_lora_rank)].transpose(1, 2)
    return absorb(latent, key_of, 1, int(module.qk_nope_head_dim), int(module.v_head_dim)).transpose(1, 2)


def write_absorb(g: Any, node: onnx.NodeProto, weight: str, heads: int) -> None:
    """The MatMul by each head's W_UK (part 0) or W_UV (part 1), read from kv_b_proj's [H * (nope + v), rank]."""
    part, nope = (next(a.i for a in node.attribute if a.name == n) for n in ("part", "nope"))
    matrix = np.asarray(g.checkpoint.get(weight), np.float32)
    per_head = matrix.reshape(heads, -1, matrix.shape[1])
    chosen = per_head[:, :nope, :] if part == 0 else per_head[:, nope:, :].transpose(0, 2, 1)
    name = g.weights.add(f"{weight}.absorbed{part}", np.ascontiguousarray(chosen))
    g.nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [node.output[0]],
                                         name=f"{weight}.absorb{part}"))
