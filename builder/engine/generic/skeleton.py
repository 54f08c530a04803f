"""transformers' model with its big weights left on the meta device, and the rest read from the checkpoint.

The model is planned with every parameter on the meta device and its buffers computed (rotary frequencies,
position tables). The linear layers' and the token table's weights stay there: the trace routes them to
placeholders (ops.py) and rewrite.py streams them from the checkpoint. Every other parameter (norms, biases of
other modules, routers, sinks, learned positions) is small and is read now, so the trace carries its values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from builder.engine.checkpoint import Checkpoint
from builder.engine.layer_weights import load_tensor
from builder.errors import UnsupportedModel

KEY = "_mbuild_key"  # the placeholder key a module's weights are streamed under


@dataclass(frozen=True)
class Streamed:
    """A module whose weight is streamed by rewrite.py: checkpoint names, and how its rows lie."""

    module: str
    weight: str  # the checkpoint tensor: [out, in] for linear layers, [in, out] where transposed (GPT-2's Conv1D);
    # a bias is read beside it by the writer (decoder_graph.GraphWriter.linear)
    transposed: bool = False


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters are moved to the meta device as modules register them; buffers stay real. accelerate's
    init_empty_weights(include_buffers=False) does this, but mbuild does not depend on accelerate."""
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def plan_model(config: Any, attention: str, experts: str | None = None) -> Any:
    """The *ForCausalLM with `attention` (and `experts`) as its implementations, parameters on the meta device."""
    with parameters_on_meta():
        try:
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention,
                                                    experts_implementation=experts).eval()
        except (KeyError, ValueError) as exc:  # a model whose attention classes are chosen by name, not the interface
            raise UnsupportedModel("its modeling code does not run attention through transformers' attention "
                                   f"interface, where the generic export puts the engine's ({exc})") from exc


def checkpoint_names(model: Any, checkpoint: Checkpoint) -> dict[str, str]:
    """The model's parameter names -> the checkpoint's, by transformers' own renamings for the model (GPT-NeoX's
    embed_out is lm_head; a checkpoint of the base model lacks its prefix), as from_pretrained renames them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    ours = dict.fromkeys(model.state_dict())
    found = {}
    for name in checkpoint.names():
        renamed, _ = rename_source_key(name, renamings, [], model.base_model_prefix, ours)
        found[renamed] = name
    return found


def _source(checkpoint: Checkpoint, names: dict[str, str], name: str, tied: dict[int, str],
            param: torch.Tensor) -> str:
    """The checkpoint's tensor for a streamed weight; a tied head reads the token table."""
    if names.get(name, name) in checkpoint:
        return names.get(name, name)
    if id(param) in tied:
        return tied[id(param)]
    raise UnsupportedModel(f"the checkpoint lacks tensor {name!r}", hint="is it a complete download?")


@dataclass(frozen=True)
class Streams:
    """What rewrite.py streams: the linear layers (by key), the token table, and the model's names for the
    checkpoint's tensors (checkpoint_names), which the experts are read by."""

    linears: list[Streamed]
    embedding: Streamed
    stored: dict[str, str]


def _is_experts(module: torch.nn.Module) -> bool:
    """A module transformers' experts interface runs (its use_experts_implementation decorator marks it)."""
    return hasattr(module, "is_transposed") and hasattr(module, "has_gate")


def streamed_modules(model: Any, checkpoint: Checkpoint) -> Streams:
    """Keys every linear layer, the token table and the experts (their KEY attribute), so their weights are
    streamed, not loaded."""
    table = model.get_input_embeddings()
    names = {id(module): name for name, module in model.named_modules()}
    stored = checkpoint_names(model, checkpoint)
    table_source = _source(checkpoint, stored, f"{names[id(table)]}.weight", {}, table.weight)
    tied = {id(table.weight): table_source}
    embedding = Streamed(names[id(table)], table_source)
    setattr(table, KEY, 0)
    linears: list[Streamed] = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            linears.append(Streamed(name, _source(checkpoint, stored, f"{name}.weight", tied, module.weight),
                                    transposed=isinstance(module, Conv1D)))
            setattr(module, KEY, len(linears) - 1)
        elif _is_experts(module):
            setattr(module, KEY, -1)
    for module in (m for m in model.modules() if hasattr(m, KEY)):
        _unregister(module)
    return Streams(linears, embedding, stored)


def _unregister(module: torch.nn.Module) -> None:
    """Its (meta) parameters kept as plain attributes: the exported program lifts every registered parameter
    into the graph, and these are streamed instead."""
    for leaf in list(module._parameters):
        module.__dict__[leaf] = module._parameters.pop(leaf)


def load_rest(model: Any, checkpoint: Checkpoint, skip: set[int], stored: dict[str, str], prefix: str = "") -> None:
    """Every parameter of the modules not in `skip` (ids), from the checkpoint into memory; a parameter tied to
    another (a head to its token table) is read once and shared as before. `stored`: checkpoint_names'."""
    loaded: dict[int, torch.nn.Parameter] = {}
    for module_name, module in model.named_modules():
        if id(module) in skip:
            continue
        for leaf, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) not in loaded:
                name = ".".join(part for part in (prefix, module_name, leaf) if part)
                loaded[id(param)] = torch.nn.Parameter(load_tensor(checkpoint, stored.get(name, name),
                                                                   tuple(param.shape)),
                                                       requires_grad=False)
            module._parameters[leaf] = loaded[id(param)]


def keyed(model: Any) -> set[int]:
    """The modules whose weights are streamed (streamed_modules keyed them)."""
    return {id(m) for m in model.modules() if hasattr(m, KEY)}


def unload(module: torch.nn.Module) -> None:
    """Its parameters back to the meta device (buffers stay): the memory they held is free."""
    for m in module.modules():
        for leaf, param in list(m._parameters.items()):
            if param is not None:
                m._parameters[leaf] = torch.nn.Parameter(param.to("meta"), requires_grad=False)
