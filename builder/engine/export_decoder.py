"""Export a decoder-only language model (Llama, Mistral, Qwen2) to ONNX with an explicit KV cache.

Why mbuild writes this graph itself (torch.onnx over the model's own modules) rather than using
onnxruntime-genai's builder: continuous batching needs rows of different lengths in one batch, each
left-padded, masked, and at its own positions, with sequences joining and leaving between steps.
This graph takes exactly that (input_ids, a 2-D attention_mask over past + new tokens, position_ids,
past keys/values per layer) and returns only the last position's logits plus the grown cache. The
layers, norms, MLP and the model's own rotary frequencies (with Llama 3's scaling) come from the
transformers modules, and the build's numerical gate compares the result with transformers.generate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from builder.engine.exported import ExportResult
from builder.engine.quiet import quiet_ml
from builder.errors import UnsupportedModel

SUPPORTED = {"llama", "mistral", "qwen2"}


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
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
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


def _chat_template(model_dir: Path, tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    if not template and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return str(template) if template else None


def _eos_ids(model_dir: Path, config: Any, tokenizer: Any) -> list[int]:
    found: list[int] = []
    path = model_dir / "generation_config.json"
    sources = [json.loads(path.read_text()).get("eos_token_id")] if path.is_file() else []
    sources += [getattr(config, "eos_token_id", None), tokenizer.eos_token_id]
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in found:
                found.append(token)
    return found


@quiet_ml()  # a contextmanager is also a decorator: the whole export runs with the libraries quiet
def export_decoder(model_dir: Path, out_dir: Path) -> ExportResult:
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in SUPPORTED:
        raise UnsupportedModel(f"language models of type {config.model_type!r} are not supported yet",
                               hint=f"supported: {', '.join(sorted(SUPPORTED))}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModel("the model has no fast (Rust) tokenizer, which the runtime needs")
    wrapper = KvDecoder(model).eval()
    layers = config.num_hidden_layers
    past = [f"past.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
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
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": tokenizer.bos_token or "", "eos_token": tokenizer.eos_token or ""}
    return ExportResult(
        task="text-generation",
        inputs=("input_ids", "attention_mask", "position_ids", *past),
        output="logits",
        dimensions=int(config.vocab_size),
        max_seq_length=int(config.max_position_embeddings),
        pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
        options={"layers": layers, "kv_heads": wrapper.kv_heads, "head_dim": wrapper.head_dim,
                 "eos_token_ids": _eos_ids(model_dir, config, tokenizer), "special_tokens": special,
                 "chat_template": _chat_template(model_dir, tokenizer)},
    )
