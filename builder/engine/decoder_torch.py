"""The grown-cache decoder graph, for TensorRT: torch.onnx over the model's own modules.

TensorRT cannot run ONNX Runtime's GroupQueryAttention, so its engines get this graph instead of
decoder_graph.py's: input_ids, a 2-D attention_mask over past + new tokens, position_ids and past
keys/values per layer in, and logits_at (which of the flattened new positions give logits, as
decoder_graph.py's); those logits and the grown cache (past + new) out. The runtime
drives it through the same slot interface, copying the cache (runtimes/engines/decoder.py): each row's past
sits left-aligned (slot j holds position j), right-padded to the longest row, the new tokens after it.
The decoder layers run whole, as transformers' (attention, norms, MLP or experts), around an explicit cache
(grown_cache.py); only the glue around them (embedding scale, rotary tables, per-layer masks with their
windows, final norm, head, logit scaling) is family_glue.py's, the same the gate's reference uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from builder.engine.family_glue import FamilyGlue, attention_bias
from builder.engine.grown_cache import DENSE_EXPERTS, GrownCache
from builder.model.geometry import HeadGeometry, head_geometry


class KvDecoder(torch.nn.Module):
    """The model's layers around an explicit, per-row cache; see the module docstring."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.glue = FamilyGlue.of(model)
        self.geometry = head_geometry(model.config)
        self.kv_heads, self.head_dim = self.geometry.kv_heads, self.geometry.head_dim

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                logits_at: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inner, glue = self.model.model, self.glue
        x = glue.embedded(torch.nn.functional.embedding(input_ids, inner.embed_tokens.weight))
        before = past[0].shape[2]
        # each key's position, for causality and windows: past slot j holds position j, new tokens theirs
        key_pos = torch.cat([torch.arange(before).unsqueeze(0).expand(input_ids.shape[0], -1), position_ids], dim=1)
        masks = {window: attention_bias(position_ids, key_pos, attention_mask, window, x.dtype)
                 for window in set(glue.windows)}
        rotations = glue.rotations(inner.rotary_emb, x, position_ids, traced=True)
        cache = GrownCache(past)
        for i, layer in enumerate(inner.layers):
            out = layer(x, attention_mask=masks[glue.windows[i]], position_ids=position_ids,
                        position_embeddings=rotations[glue.layer_types[i]], cache=cache)
            x = out[0] if isinstance(out, tuple) else out
        picked = x.reshape(-1, x.shape[-1]).index_select(0, logits_at)
        logits = glue.logits(self.model.lm_head(inner.norm(picked)))
        return (logits, *cache.present)


def write_grown_cache_graph(model_dir: Path, config: Any, out_dir: Path) -> tuple[list[str], HeadGeometry]:
    """model.onnx in out_dir; returns the past input names and the cache's geometry."""
    # eager: the attention the masks above are made for, as plain MatMul and Softmax nodes; dense experts: see
    # grown_cache.py (a dense model never calls them)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation=DENSE_EXPERTS).eval()
    wrapper = KvDecoder(model).eval()
    past = [f"past.{i}.{kind}" for i in range(wrapper.geometry.layers) for kind in ("key", "value")]
    present = [name.replace("past", "present") for name in past]
    example = (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 7, dtype=torch.long),
               torch.arange(4, 7).repeat(2, 1), torch.tensor([2, 5]),
               *(torch.zeros(2, wrapper.kv_heads, 4, wrapper.head_dim) for _ in past))
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch", 1: "new"}, "attention_mask": {0: "batch", 1: "total"},
                                       "position_ids": {0: "batch", 1: "new"}, "logits_at": {0: "picked"},
                                       "logits": {0: "picked"}}
    axes.update({name: {0: "batch", 2: "past"} for name in past})
    axes.update({name: {0: "batch", 2: "total"} for name in present})
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(wrapper, example, str(out_dir / "model.onnx"), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask", "position_ids", "logits_at", *past],
                          output_names=["logits", *present], dynamic_axes=axes)
    return past, wrapper.geometry
