"""One module's weights from the checkpoint into its meta-planned transformers module, in fp32 (reference.py).

Mostly the module's state_dict names are the checkpoint's. Mixture-of-experts layers differ: transformers 5
holds a layer's experts fused, gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and
down_proj [E, H, I], while Mixtral and Qwen3-MoE checkpoints hold them one expert at a time, and
from_pretrained fuses them as it loads (its conversion_mapping: Mixtral's block_sparse_moe.experts.{j}.w1 and
w3 into gate_up_proj, w2 into down_proj, the block renamed mlp; Qwen2-MoE's layout, mlp.experts.{j}.gate_proj,
up_proj and down_proj, the same way). That conversion runs inside the whole-model load, with no entry point
for one module, so the same fusion is done here, written an expert at a time into the fused parameter: memory
holds the layer and one expert's tensor, never a second copy of the layer. gpt-oss checkpoints are fused
already and load by name.
"""

from __future__ import annotations

import torch

from builder.engine.checkpoint import Checkpoint
from builder.errors import UnsupportedModel

# A fused expert parameter -> the per-expert tensors stacked along its rows, in each checkpoint layout.
PER_EXPERT = {"gate_up_proj": (("gate_proj", "up_proj"), ("w1", "w3")), "down_proj": (("down_proj",), ("w2",))}
RENAMED = ((".mlp.", ".block_sparse_moe."),)  # transformers' name -> an older checkpoint's (Mixtral)


def _spellings(name: str) -> list[str]:
    return [name, *(name.replace(new, old) for new, old in RENAMED if new in name)]


def _found(checkpoint: Checkpoint, name: str) -> str | None:
    """The checkpoint's name for a module tensor's full name, if it holds it whole."""
    return next((candidate for candidate in _spellings(name) if candidate in checkpoint), None)


def per_expert(checkpoint: Checkpoint, name: str, experts: int) -> list[list[str]] | None:
    """For a fused expert parameter, each expert's checkpoint tensors in stacking order."""
    stem, _, leaf = name.rpartition(".")
    for base in _spellings(stem):
        # the layouts older checkpoints store; else each expert's own tensor of the same name (transformers'
        # MergeModulelist: Nemotron-H's up_proj)
        for layout in (*PER_EXPERT.get(leaf, ()), (leaf,)):
            if f"{base}.0.{layout[0]}.weight" in checkpoint:
                return [[f"{base}.{j}.{part}.weight" for part in layout] for j in range(experts)]
    return None


def _copy(target: torch.Tensor, checkpoint: Checkpoint, source: str, shown: str) -> None:
    if checkpoint.shape(source) != tuple(target.shape):
        raise UnsupportedModel(f"tensor {source!r} has shape {list(checkpoint.shape(source))}, but the model's "
                               f"config makes {shown} {list(target.shape)}", hint="is config.json the model's own?")
    target.copy_(torch.from_numpy(checkpoint.get(source)))


def _missing(checkpoint: Checkpoint, name: str) -> UnsupportedModel:
    if f"{name}_blocks" in checkpoint:  # gpt-oss as OpenAI publishes it
        return UnsupportedModel(f"tensor {name!r} is stored MXFP4-quantized ({name}_blocks, _scales); mbuild reads "
                                f"F32, F16 and BF16 weights", hint="use a bf16 copy of the model")
    return UnsupportedModel(f"the checkpoint lacks tensor {name!r}", hint="is it a complete download?")


def load_module(module: torch.nn.Module, checkpoint: Checkpoint, prefix: str) -> None:
    """The module's tensors, from meta into memory, read from the checkpoint under `prefix`."""
    module.to_empty(device="cpu")
    with torch.no_grad():
        for local, target in module.state_dict().items():
            fill(target, checkpoint, f"{prefix}.{local}")


def load_tensor(checkpoint: Checkpoint, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One tensor of the model, fp32, of the shape its config makes."""
    target = torch.empty(shape, dtype=torch.float32)
    fill(target, checkpoint, name)
    return target


def fill(target: torch.Tensor, checkpoint: Checkpoint, name: str) -> None:
    """A model tensor's values from the checkpoint: held whole, or fused from one tensor an expert."""
    found = _found(checkpoint, name)
    if found is not None:
        _copy(target, checkpoint, found, name)
        return
    parts = per_expert(checkpoint, name, target.shape[0]) if target.dim() == 3 else None
    if parts is None:
        raise _missing(checkpoint, name)
    for expert, sources in enumerate(parts):
        row = 0
        for source in sources:
            rows = checkpoint.shape(source)[0]
            _copy(target[expert, row:row + rows], checkpoint, source, f"{name}[{expert}, {row}:{row + rows}]")
            row += rows
        if row != target.shape[1]:
            raise UnsupportedModel(f"the experts of {name!r} stack to {row} rows, but the model's config "
                                   f"makes {target.shape[1]}", hint="is config.json the model's own?")
