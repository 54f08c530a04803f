"""The gate's reference for language models: transformers' own modules in fp32, one decoder layer in memory at a time.

The gate needs the model's fp32 logits along some token sequences. Loading the model whole would take
4 bytes per parameter (32 GB for an 8B model) beside the engine; here the model is planned on the meta
device and each decoder layer gets its weights from the checkpoint (checkpoint.py), runs every sequence,
and gives them back before the next one, so memory holds one layer and the activations (layer_weights.py,
which also fuses per-expert MoE checkpoints as from_pretrained does). The embedding rows are read for the
tokens used, and the LM head a block of vocabulary rows at a time. What the model does around its layers
(embedding scale, per-layer rotary tables and windows, logit scaling and soft-capping) is family_glue.py's.
Why not accelerate's disk offload: it re-saves the weights in the compute dtype (an fp32 copy of an 8B
bf16 model is 32 GB more disk) and runs the same layers the same way, one at a time.
"""

from __future__ import annotations

import ctypes
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from builder.engine.checkpoint import Checkpoint
from builder.engine.family_glue import FamilyGlue, attention_bias
from builder.engine.generic.reference import generic_reference_logits
from builder.engine.layer_weights import load_module
from builder.engine.weight_writer import BLOCK_BYTES
from builder.model.families import fast_lane

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MAPPED_BYTES = 1 << 20


def _map_big_blocks() -> None:
    """Every block of MAPPED_BYTES or more in its own mapping, unmapped when freed. glibc raises its threshold to the
    largest block freed (up to 32 MiB), after which a layer's weights (16 MiB matrices at hidden 1024) come from the
    heap, where freed ones can lie fragmented: some gates of a ~0.41B Llama grew 48 MiB a layer, 1.45 GiB in all
    against 0.62. A threshold set by hand stays put; nothing to do where the C library has no mallopt."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MAPPED_BYTES)


def _masks(length: int, glue: FamilyGlue) -> dict[int | None, torch.Tensor]:
    """Causal (and sliding-window) additive masks [1, 1, S, S], one per window the layers use."""
    where = torch.arange(length).unsqueeze(0)
    return {window: attention_bias(where, where, torch.ones_like(where), window, torch.float32)
            for window in set(glue.windows)}


@torch.inference_mode()
def reference_logits(model_dir: Path, sequences: list[list[int]], first: list[int]) -> list[np.ndarray]:
    """fp32 logits [len(seq) - first, vocab] of each sequence's positions first-1 .. len-2 (the ones that
    predict tokens first .. len-1)."""
    _map_big_blocks()
    config = AutoConfig.from_pretrained(model_dir)
    if not fast_lane(config.model_type):
        return generic_reference_logits(model_dir, sequences, first)
    config._attn_implementation = "eager"  # the explicit masks below carry causality and sliding windows
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    glue = FamilyGlue.of(model)
    rotary = type(model.model.rotary_emb)(model.config)  # built off the meta device: its tables are computed
    with ExitStack() as stack:
        checkpoint = Checkpoint(model_dir, stack)
        embed = "model.embed_tokens.weight"
        states = [glue.embedded(torch.from_numpy(np.concatenate([checkpoint.rows(embed, t, t + 1) for t in seq])))
                  .unsqueeze(0) for seq in sequences]
        positions = [torch.arange(len(seq)).unsqueeze(0) for seq in sequences]
        rotations = [glue.rotations(rotary, state, where) for state, where in zip(states, positions, strict=True)]
        masks = [_masks(len(seq), glue) for seq in sequences]
        for i, layer in enumerate(model.model.layers):
            load_module(layer, checkpoint, f"model.layers.{i}")
            for s, state in enumerate(states):
                out = layer(state, attention_mask=masks[s][glue.windows[i]], position_ids=positions[s],
                            position_embeddings=rotations[s][glue.layer_types[i]])
                states[s] = out[0] if isinstance(out, tuple) else out
            layer.to("meta")  # its weights go before the next layer's come
        load_module(model.model.norm, checkpoint, "model.norm")
        hidden = [model.model.norm(state[0, start - 1:-1]).numpy() for state, start in zip(states, first, strict=True)]
        head = embed if getattr(config, "tie_word_embeddings", False) else "lm_head.weight"  # tied: the embedding table
        blocks: list[list[np.ndarray]] = [[] for _ in sequences]
        for _, rows in checkpoint.blocks([head], BLOCK_BYTES):
            for s, h in enumerate(hidden):
                blocks[s].append(h @ rows.T)
    return [glue.logits(torch.from_numpy(np.concatenate(b, axis=1))).numpy() for b in blocks]
