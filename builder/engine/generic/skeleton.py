"""transformers' model with its big weights left on the meta device, and the rest read from the checkpoint.

The model is planned with every parameter on the meta device and its buffers computed (rotary frequencies,
position tables). The linear layers' and the token table's weights stay there: the trace routes them to
placeholders (ops.py) and rewrite.py streams them from the checkpoint. Every other parameter (norms, biases of
other modules, routers, sinks, learned positions) is small and is read now, so the trace carries its values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from builder.engine.checkpoint import Checkpoint
from builder.engine.layer_weights import load_tensor
from builder.engine.weight_writer import LinearFormat
from builder.errors import UnsupportedModel


class OwnAttention(UnsupportedModel):
    """Attention the in-place cache's op does not compute (a mask or bias of the model's own, a layer that attends
    twice, attention outside transformers' interface) but the model's own code can, over a grown cache
    (grown.py)."""

KEY = "_mbuild_key"  # the placeholder key a module's weights are streamed under
SILU = ("SiLU", "SiLUActivation")
# fp32 bytes of experts the trace may carry as they are, in the graph (a protobuf holds 2 GB at most)
TRACED_EXPERTS_BYTES = 1 << 30


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
            raise OwnAttention("its modeling code does not run attention through transformers' attention "
                                   f"interface, where the generic export puts the engine's ({exc})") from exc


def checkpoint_names(model: Any, checkpoint: Checkpoint) -> dict[str, str]:
    """The model's parameter names -> the checkpoint's, by transformers' own renamings for the model (GPT-NeoX's
    embed_out is lm_head; a checkpoint of the base model lacks its prefix), as from_pretrained renames them. A
    fused tensor transformers splits by rows on load (q|k|v into q, k and v) becomes one part a target in
    `checkpoint` (Checkpoint.parts), read as a tensor of its own."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    splits = [t for t in transforms if isinstance(t, WeightConverter) and _row_split(t) is not None]
    joins = [t for t in transforms if isinstance(t, WeightConverter) and _row_join(t)]
    ours = dict.fromkeys(model.state_dict())
    found: dict[str, str] = {}
    joined: dict[str, list[str | None]] = {}
    for name in checkpoint.names():
        renamed, pattern = rename_source_key(name, renamings, splits, model.base_model_prefix, ours)
        if pattern is None:
            found[renamed] = name
            shape = checkpoint.shape(name)
            if renamed != name and renamed not in checkpoint and shape:  # read by the model's name too (an
                checkpoint.parts[renamed] = (name, 0, shape[0])  # expert's own tensor, stacked per expert)
            for converter in joins:  # one of several stored tensors transformers joins by rows
                for at, source in enumerate(converter.source_patterns):
                    target = re.sub(source, converter.target_patterns[0], renamed)
                    if target != renamed and target in ours:
                        joined.setdefault(target, [None] * len(converter.source_patterns))[at] = name
            continue
        converter = next(c for c in splits if pattern in c.source_patterns)
        targets = [renamed.replace(converter.target_patterns[0], t) for t in converter.target_patterns]
        if not all(t in ours for t in targets):  # not this model's: left as stored
            found[name] = name
            continue
        sizes = ([int(model.get_parameter(t).shape[0]) for t in targets] if _row_split(converter) == "Split"
                 else [checkpoint.shape(name)[0] // len(targets)] * len(targets))
        first = 0
        for target, size in zip(targets, sizes, strict=True):
            checkpoint.parts[target] = (name, first, first + size)
            found[target] = target
            first += size
    for target, sources in joined.items():
        if all(sources):
            checkpoint.joins[target] = [str(source) for source in sources]
            found[target] = target
    return found


def _row_join(converter: Any) -> bool:
    """Whether a converter only joins several stored tensors, by rows, into one (Kimi-Linear's q, k and v
    convolutions into one conv1d)."""
    from transformers.core_model_loading import Concatenate

    (op, *more) = converter.operations
    return (not more and isinstance(op, Concatenate) and op.dim == 0 and len(converter.source_patterns) > 1
            and len(converter.target_patterns) == 1)


def _row_split(converter: Any) -> str | None:
    """"Split" or "Chunk" where a converter only cuts one stored tensor into its targets by rows, else None."""
    from transformers.core_model_loading import Chunk, Split

    (op, *more) = converter.operations
    if more or len(converter.source_patterns) != 1 or len(converter.target_patterns) < 2:
        return None
    if getattr(op, "dim", None) != 0:
        return None
    if isinstance(op, Split) or (isinstance(op, Chunk) and op.num_shards_attribute is None):
        return type(op).__name__
    return None


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
    parts: dict[str, tuple[str, int, int]]  # the checkpoint's parts (Checkpoint.parts) the names above read


def _is_experts(module: torch.nn.Module) -> bool:
    """A module transformers' experts interface runs (its use_experts_implementation decorator marks it)."""
    return hasattr(module, "is_transposed") and hasattr(module, "has_gate")


def moe_refusal(module: torch.nn.Module) -> str | None:
    """Why ONNX Runtime's MoE does not compute these experts (a module of transformers' experts interface); None
    where it does: SwiGLU experts, silu(gate) * up from [gate; up] rows, with no norm after them."""
    from transformers.integrations.moe import _default_apply_gate

    if getattr(module, "has_post_expert_norm", False) or not getattr(module, "has_gate", True) \
            or not getattr(module, "is_concatenated", True):
        return "its experts are not gated MLPs (SwiGLU) over [gate; up] rows, the only experts ONNX Runtime's MoE runs"
    act = getattr(module, "act_fn", None)
    if getattr(type(module), "_apply_gate", None) is not _default_apply_gate or type(act).__name__ not in SILU:
        gate = type(act).__name__ if act is not None else "a gate"
        return f"its experts gate with {gate} of their own; ONNX Runtime's MoE runs silu(gate) * up"
    return None


def _traced_experts(model: Any, form: LinearFormat) -> set[int]:
    """The experts ONNX Runtime's MoE does not compute, traced as transformers' batched implementation computes them
    with their weights in the graph: fp32 and small ones only, else the reason is refused."""
    odd = [(m, why) for m in model.modules() if _is_experts(m) and (why := moe_refusal(m)) is not None]
    if not odd:
        return set()
    why = odd[0][1]
    if form.kind != "fp32":
        raise UnsupportedModel(f"{why}, and traced as they are they would stay fp32, not {form.kind}",
                               hint="build it with --precision fp32")
    size = sum(4 * p.numel() for m, _ in odd for p in m.parameters())
    if size > TRACED_EXPERTS_BYTES:
        raise UnsupportedModel(f"{why}, and traced as they are their {size >> 20} MiB of weights would sit in the "
                               f"graph, which holds {TRACED_EXPERTS_BYTES >> 20} MiB of them")
    return {id(m) for m, _ in odd}


def streamed_modules(model: Any, checkpoint: Checkpoint, form: LinearFormat | None = None) -> Streams:
    """Keys every linear layer, the token table and the experts (their KEY attribute), so their weights are
    streamed, not loaded; experts ONNX Runtime's MoE does not compute are left to load_rest (_traced_experts)."""
    table = model.get_input_embeddings()
    names = {id(module): name for name, module in model.named_modules()}
    stored = checkpoint_names(model, checkpoint)
    traced = _traced_experts(model, form or LinearFormat())
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
        elif _is_experts(module) and id(module) not in traced:
            setattr(module, KEY, -1)
    for module in (m for m in model.modules() if hasattr(m, KEY)):
        _unregister(module)
    return Streams(linears, embedding, stored, dict(checkpoint.parts))


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
