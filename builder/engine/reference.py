"""The gate's reference for language models: transformers' own modules in fp32, one decoder layer in memory at a time.

The gate needs the model's fp32 logits along some token sequences. Loading the model whole would take
4 bytes per parameter (32 GB for an 8B model) beside the engine; here the model is planned on the meta
device and each decoder layer gets its weights from the checkpoint (checkpoint.py), runs every sequence,
and gives them back before the next one, so memory holds one layer and the activations. The embedding
rows are read for the tokens used, and the LM head a block of vocabulary rows at a time.
Why not accelerate's disk offload: it re-saves the weights in the compute dtype (an fp32 copy of an 8B
bf16 model is 32 GB more disk) and runs the same layers the same way, one at a time.
"""

from __future__ import annotations

import importlib
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_family import attention_window
from builder.engine.weight_writer import BLOCK_BYTES


def _load(module: torch.nn.Module, checkpoint: Checkpoint, prefix: str) -> None:
    """The module's weights, from meta into memory, in fp32."""
    module.to_empty(device="cpu")
    state = {name: torch.from_numpy(checkpoint.get(f"{prefix}.{name}")) for name in module.state_dict()}
    module.load_state_dict(state)


def _mask(length: int, window: int) -> torch.Tensor:
    """Causal (and sliding-window) additive mask [1, 1, S, S], as transformers' eager attention adds it."""
    query = torch.arange(length).unsqueeze(1)
    key = torch.arange(length).unsqueeze(0)
    allowed = key <= query
    if window > 0:
        allowed &= key > query - window
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min).view(1, 1, length, length)


def _rotary(config: Any) -> torch.nn.Module:
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    rotary_class = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    rotary: torch.nn.Module = rotary_class(config)
    return rotary


@torch.inference_mode()
def reference_logits(model_dir: Path, sequences: list[list[int]], first: list[int]) -> list[np.ndarray]:
    """fp32 logits [len(seq) - first, vocab] of each sequence's positions first-1 .. len-2 (the ones that
    predict tokens first .. len-1)."""
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "eager"  # the explicit mask below carries causality and sliding windows
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rotary = _rotary(config)
    with ExitStack() as stack:
        checkpoint = Checkpoint(model_dir, stack)
        embed = "model.embed_tokens.weight"
        states = [torch.from_numpy(np.concatenate([checkpoint.rows(embed, t, t + 1) for t in seq])).unsqueeze(0)
                  for seq in sequences]
        positions = [torch.arange(len(seq)).unsqueeze(0) for seq in sequences]
        rotations = [rotary(state, where) for state, where in zip(states, positions, strict=True)]
        for i, layer in enumerate(model.model.layers):
            _load(layer, checkpoint, f"model.layers.{i}")
            window = attention_window(config, i)
            for s, state in enumerate(states):
                out = layer(state, attention_mask=_mask(state.shape[1], window), position_ids=positions[s],
                            position_embeddings=rotations[s])
                states[s] = out[0] if isinstance(out, tuple) else out
            layer.to("meta")  # its weights go before the next layer's come
        _load(model.model.norm, checkpoint, "model.norm")
        hidden = [model.model.norm(state[0, start - 1:-1]).numpy() for state, start in zip(states, first, strict=True)]
        head = "lm_head.weight" if "lm_head.weight" in checkpoint else embed
        blocks: list[list[np.ndarray]] = [[] for _ in sequences]
        for _, rows in checkpoint.blocks([head], BLOCK_BYTES):
            for s, h in enumerate(hidden):
                blocks[s].append(h @ rows.T)
    return [np.concatenate(b, axis=1) for b in blocks]
