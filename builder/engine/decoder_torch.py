"""The grown-cache decoder graph, for TensorRT: torch.onnx over the model's own modules.

TensorRT cannot run ONNX Runtime's GroupQueryAttention, so its engines get this graph instead of
decoder_graph.py's: input_ids, a 2-D attention_mask over past + new tokens, position_ids and past
keys/values per layer in; the last position's logits and the grown cache (past + new) out. The runtime
drives it through the same slot interface, copying the cache (runtimes/engines/decoder.py). The layers,
norms, MLP and the model's own rotary frequencies (with Llama 3's scaling) come from transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from builder.model.geometry import HeadGeometry, head_geometry


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class KvDecoder(torch.nn.Module):
    """The model's layers around an explicit, per-row cache; see the module docstring."""

    inv_freq: torch.Tensor

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self.geometry = head_geometry(config)
        self.heads, self.kv_heads, self.head_dim = self.geometry.heads, self.geometry.kv_heads, self.geometry.head_dim
        rotary = model.model.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inner = self.model.model
        x = inner.embed_tokens(input_ids)
        batch, new = input_ids.shape
        before = past[0].shape[2]
        angles = position_ids.unsqueeze(-1).to(torch.float32) * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos = (angles.cos() * self.rope_scale).unsqueeze(1).to(x.dtype)
        sin = (angles.sin() * self.rope_scale).unsqueeze(1).to(x.dtype)
        query_pos = torch.arange(new).unsqueeze(1) + before
        key_pos = torch.arange(before + new).unsqueeze(0)
        allowed = (key_pos <= query_pos).unsqueeze(0) & attention_mask.bool().unsqueeze(1)
        bias = torch.where(allowed, torch.zeros((), dtype=x.dtype),
                           torch.full((), torch.finfo(x.dtype).min, dtype=x.dtype)).unsqueeze(1)
        presents: list[torch.Tensor] = []
        group = self.heads // self.kv_heads
        for index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, new, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = torch.cat([past[2 * index], k * cos + _rotate_half(k) * sin], dim=2)
            v = torch.cat([past[2 * index + 1], v], dim=2)
            presents += [k, v]
            scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * self.head_dim**-0.5 + bias
            out = torch.softmax(scores, dim=-1) @ v.repeat_interleave(group, dim=1)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, new, self.heads * self.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = self.model.lm_head(inner.norm(x[:, -1, :]))
        return (logits, *presents)


def write_grown_cache_graph(model_dir: Path, config: Any, out_dir: Path) -> tuple[list[str], HeadGeometry]:
    """model.onnx in out_dir; returns the past input names and the cache's geometry."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    wrapper = KvDecoder(model).eval()
    past = [f"past.{i}.{kind}" for i in range(wrapper.geometry.layers) for kind in ("key", "value")]
    present = [name.replace("past", "present") for name in past]
    example = (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 7, dtype=torch.long),
               torch.arange(4, 7).repeat(2, 1),
               *(torch.zeros(2, wrapper.kv_heads, 4, wrapper.head_dim) for _ in past))
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch", 1: "new"}, "attention_mask": {0: "batch", 1: "total"},
                                       "position_ids": {0: "batch", 1: "new"}, "logits": {0: "batch"}}
    axes.update({name: {0: "batch", 2: "past"} for name in past})
    axes.update({name: {0: "batch", 2: "total"} for name in present})
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(wrapper, example, str(out_dir / "model.onnx"), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask", "position_ids", *past],
                          output_names=["logits", *present], dynamic_axes=axes)
    return past, wrapper.geometry
