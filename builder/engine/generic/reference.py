"""The gate's reference for the generic path: transformers' own forward in fp32, one decoder layer in memory at
a time.

As builder/engine/reference.py, but without knowing what the model does around its layers: the model is
planned with its parameters on the meta device, everything outside its stack of layers (the longest ModuleList:
token table, head, final norm) is read once, and each layer reads its weights just before it runs and gives
them back after, through forward hooks. The prompts run as one right-padded batch, so each layer is read
once; causal attention keeps a row's logits blind to the padding after it. Positions are passed as generate()
passes them, counted from 0: a model that would derive its own from the ids (RoBERTa's, after its padding
index) is held to what transformers' generate computes.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig

from builder.engine.checkpoint import Checkpoint
from builder.engine.generic.skeleton import checkpoint_names, load_rest, plan_model, unload


def _layers(model: Any) -> list[tuple[str, torch.nn.Module]]:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    name, stack = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}", layer) for i, layer in enumerate(stack)]


@torch.inference_mode()
def generic_reference_logits(model_dir: Path, sequences: list[list[int]], first: list[int]) -> list[np.ndarray]:
    """fp32 logits [len(seq) - first, vocab] of each sequence's positions first-1 .. len-2."""
    config = AutoConfig.from_pretrained(model_dir)
    model = plan_model(config, "eager")
    layers = _layers(model)
    with ExitStack() as stack:
        checkpoint = Checkpoint(model_dir, stack)
        stored = checkpoint_names(model, checkpoint)
        for name, layer in layers:
            layer.register_forward_pre_hook(
                lambda module, args, name=name: load_rest(module, checkpoint, set(), stored, name))
            layer.register_forward_hook(lambda module, args, out: unload(module))
        load_rest(model, checkpoint, {id(m) for _, layer in layers for m in layer.modules()}, stored)
        longest = max(len(s) for s in sequences)
        ids = torch.tensor([s + [0] * (longest - len(s)) for s in sequences])
        mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sequences])
        # positions as generate() gives them (the mask's running count, from 0), which the engine's are too
        positions = torch.arange(longest).unsqueeze(0).expand(len(sequences), -1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits.float()
    return [logits[row, start - 1:len(seq) - 1].numpy() for row, (seq, start) in enumerate(zip(sequences, first,
                                                                                                  strict=True))]
