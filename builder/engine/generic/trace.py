"""The trace: transformers' model, its weights routed to placeholders (ops.py), as an ONNX graph with the
fast lane's inputs and outputs (decoder_graph.py's docstring names them).

transformers' attention interface takes mbuild's attention: every attention module calls it after its own
projections, norms and rotary embedding with q [B, H, S, D], the new keys and values and its scaling, window,
soft cap and sinks; the placeholder gets them with the layer's past cache, and its outputs are the step's
present cache. No attention mask is made (the attention is causal, windowed by the layer's window), and
positions come from seqlens_k as GroupQueryAttention counts them. The LM head's input is narrowed to the
positions logits_at picks before the head runs, so whatever the model does after its head (a soft cap, a
scale) applies to those rows only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from torch.export import Dim
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, batched_mm_experts_forward
from transformers.modeling_utils import AttentionInterface
from transformers.pytorch_utils import Conv1D

from builder.engine.generic import complex_ops, latent, ops
from builder.engine.generic.skeleton import KEY, OwnAttention
from builder.errors import UnsupportedModel

ATTENTION = "mbuild_generic"  # the name of mbuild's attention, and of its experts, in transformers' interfaces
# What attention modules pass that changes nothing here: the positions and cache bookkeeping the placeholder's
# inputs already carry, and training-only switches
IGNORED = frozenset({"position_ids", "use_cache", "cache_position", "output_attentions", "layer_idx", "dropout",
                     "past_key_values", "past_key_value", "is_causal", "position_embeddings", "layer_type",
                     "token_type_ids", "attention_type", "sequence_length", "output_router_logits",
                     "output_hidden_states", "return_dict", "logits_to_keep"})


@dataclass(frozen=True)
class AttentionCall:
    """What one layer's attention asked for, read from its call during the trace."""

    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    scale: float
    window: int  # -1: the whole context
    softcap: float  # 0: none
    sinks: bool
    values_are_keys: bool = False  # multi-head latent attention over its latent: one cache holds both


@dataclass(frozen=True)
class ExpertsCall:
    """One mixture-of-experts layer's experts, read from the module transformers' experts interface hands over."""

    module: str  # its name in the model: its weights are {module}.gate_up_proj and {module}.down_proj
    count: int
    hidden: int
    inter: int
    top_k: int
    transposed: bool  # stored [E, H, 2I] and [E, I, H] rather than [E, 2I, H] and [E, H, I]
    biased: bool


@dataclass
class _Step:
    past: tuple[torch.Tensor, ...] = ()
    seqlens_k: torch.Tensor | None = None
    total: torch.Tensor | None = None
    logits_at: torch.Tensor | None = None
    present: list[torch.Tensor] = field(default_factory=list)
    calls: list[AttentionCall] = field(default_factory=list)
    experts: list[ExpertsCall] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # id(module.__dict__) -> the module's name in the model
    held: list[tuple[Any, str, torch.Tensor]] = field(default_factory=list)  # streamed parameters (readable_weights)


_STEP = _Step()  # the trace runs in one thread of the export worker


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
               scaling: float | None = None, sliding_window: int | None = None, softcap: float | None = None,
               s_aux: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    unknown = sorted(k for k, v in kwargs.items() if k not in IGNORED and v is not None)
    if unknown:
        raise OwnAttention(f"its attention asks for {', '.join(unknown)}, which mbuild's attention does not take")
    causal = kwargs.get("is_causal")  # as transformers' sdpa attention reads it: the call's word, else the module's
    if (causal if causal is not None else getattr(module, "is_causal", True)) is False:
        raise UnsupportedModel("its attention is not causal (each token attends to the tokens after it too, as an "
                               "encoder's does), which a language model's cache cannot serve",
                               hint="a model trained as a decoder says \"is_decoder\": true in its config.json")
    if attention_mask is not None:  # the trace makes no mask: one here is the model's own (a learned bias, say)
        raise OwnAttention("its attention takes a mask or bias its own code computes, which mbuild's attention "
                               "(causal, maybe windowed) does not apply")
    layer = len(_STEP.calls)
    if 2 * layer + 1 >= len(_STEP.past):
        raise OwnAttention("it runs attention more times than it has layers (a cache shared across layers?)")
    mla = latent.latent_of(module)
    if mla is not None:  # multi-head latent attention over its latent (latent.py): keys and values the entries
        query, key = latent.inputs(module, query, mla, getattr(module.kv_b_proj, KEY))
        value = key
    heads, head_dim = int(query.shape[1]), int(query.shape[3])  # not batch or length: they stay dynamic
    kv_heads, value_dim = int(key.shape[1]), int(value.shape[-1])
    if value_dim < head_dim:  # multi-head latent attention's values are narrower than its keys: the runtime's
        # attention and cache hold one width, so values are padded with zeros and the output cut back to theirs
        # (where the modeling code has no expand_kv for latent.py to take the latent at)
        value = torch.nn.functional.pad(value, (0, head_dim - value_dim))
    sink = s_aux if s_aux is not None else sinks
    _STEP.calls.append(AttentionCall(heads, kv_heads, head_dim, int(value.shape[-1]),
                                     float(scaling if scaling is not None else head_dim ** -0.5),
                                     int(sliding_window) if sliding_window else -1, float(softcap or 0.0),
                                     sink is not None, mla is not None))
    out, present_key, present_value = ops.attention(
        query, key, value, _STEP.past[2 * layer], _STEP.past[2 * layer + 1], _STEP.seqlens_k, _STEP.total,
        sink if sink is not None else torch.zeros(0), layer, int(value.shape[-1]))
    _STEP.present += [present_key, present_value]
    if mla is not None:
        return latent.output(module, out, getattr(module.kv_b_proj, KEY)), None
    return (out[..., :value_dim] if int(value.shape[-1]) != value_dim else out), None


AttentionInterface.register(ATTENTION, _attention)


def _experts(module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts interface: the layer's experts as one placeholder (ONNX Runtime's MoE or QMoE later),
    or, for experts MoE does not compute (skeleton.moe_refusal: their weights are loaded, not keyed), transformers'
    own batched implementation, traced."""
    if not hasattr(module, KEY):
        return batched_mm_experts_forward(module, hidden, top_k_index, top_k_weights)
    up = module.gate_up_proj
    count, inter = int(up.shape[0]), int(up.shape[1 if not module.is_transposed else 2]) // 2
    _STEP.experts.append(ExpertsCall(_STEP.names[id(module.__dict__)], count, int(hidden.shape[-1]), inter,
                                     int(top_k_index.shape[-1]), bool(module.is_transposed), bool(module.has_bias)))
    return ops.experts(hidden, top_k_index, top_k_weights.to(hidden.dtype), len(_STEP.experts) - 1)


ALL_EXPERTS_FUNCTIONS.register(ATTENTION, _experts)


@contextmanager
def _placeholders(model: Any) -> Iterator[None]:
    """Keyed modules' forwards call the placeholders while the trace runs; the LM head sees only logits_at's rows."""
    head = model.get_output_embeddings()
    linear, conv, table = torch.nn.Linear.forward, Conv1D.forward, torch.nn.Embedding.forward

    def linear_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, KEY):
            return linear(self, x)
        if self.__dict__ is head.__dict__ and _STEP.logits_at is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, _STEP.logits_at).unsqueeze(0)
        return ops.linear(x, getattr(self, KEY), self.out_features)

    def conv_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, getattr(self, KEY), self.nf) if hasattr(self, KEY) else conv(self, x)

    def table_forward(self: Any, ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, getattr(self, KEY), self.embedding_dim) if hasattr(self, KEY) else table(self, ids)

    torch.nn.Linear.forward, Conv1D.forward = linear_forward, conv_forward  # type: ignore[method-assign,assignment]
    torch.nn.Embedding.forward = table_forward  # type: ignore[method-assign,assignment]
    _STEP.held = [(module, leaf, value) for module in model.modules() if getattr(module, KEY, -1) >= 0
                  for leaf, value in list(module.__dict__.items()) if leaf in ops.LEAVES and value is not None]
    try:
        yield
    finally:
        torch.nn.Linear.forward, Conv1D.forward, torch.nn.Embedding.forward = linear, conv, table  # type: ignore[method-assign]
        for module, leaf, value in _STEP.held:
            module.__dict__[leaf] = value


def readable_weights() -> None:
    """The streamed modules' parameters as placeholders (ops.weight), for modeling code that reads a weight rather
    than calling its module (Falcon's linear layers compute input @ self.weight.T), which the meta tensors would
    fail; rewrite.py writes each one read as it is stored. Called inside each traced forward: one called outside
    would be a constant of the trace, not a node."""
    for module, leaf, value in _STEP.held:
        key = -1 if isinstance(module, torch.nn.Embedding) else getattr(module, KEY)
        module.__dict__[leaf] = ops.weight(key, ops.LEAVES.index(leaf), list(value.shape))


class _Decoder(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, seqlens_k: torch.Tensor, total: torch.Tensor, logits_at: torch.Tensor,
                past: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        _STEP.past, _STEP.seqlens_k, _STEP.total, _STEP.logits_at = past, seqlens_k, total, logits_at
        _STEP.calls, _STEP.present, _STEP.experts = [], [], []  # per run: the exporter may run the model again
        readable_weights()
        new = input_ids.shape[1]
        # GroupQueryAttention's positions: a row's new tokens end at its length (seqlens_k + 1)
        positions = seqlens_k.to(torch.int64).unsqueeze(1) + 1 - new + torch.arange(new).unsqueeze(0)
        logits = self.model(input_ids=input_ids, position_ids=positions, use_cache=False).logits
        return (logits.reshape(-1, logits.shape[-1]), *_STEP.present)


def _refusal(exc: BaseException) -> UnsupportedModel:
    """Why the model's code did not trace, in one line: a refusal of ours raised inside it, or the root error."""
    chain = [exc]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    ours = next((e for e in chain if isinstance(e, UnsupportedModel)), None)
    if ours is not None:
        return ours
    root = chain[-1]
    line = next((x for x in str(root).splitlines() if x.strip()), type(root).__name__)
    return UnsupportedModel(f"its modeling code does not export through torch.export ({type(root).__name__}: "
                            f"{line[:160]})", hint="see docs/models.md for the model types mbuild builds")


def trace(model: Any, layers: int) -> tuple[onnx.ModelProto, list[AttentionCall], list[ExpertsCall]]:
    """The traced graph (placeholders in, weights out but the small ones) and each layer's attention. Batch,
    new tokens and the cache's length stay dynamic; the cache's other sizes are the runtime's (rewrite.py)."""
    past = [f"past_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    present = [name.replace("past", "present") for name in past]
    example = (torch.ones(2, 3, dtype=torch.long), torch.tensor([5, 5], dtype=torch.int32),
               torch.tensor(6, dtype=torch.int32), torch.tensor([2, 5]), tuple(torch.zeros(2, 1, 8, 1) for _ in past))
    batch, new, picked, length = (Dim(n) for n in ("batch", "new", "picked", "max_length"))
    shapes = ({0: batch, 1: new}, {0: batch}, None, {0: picked}, tuple({0: batch, 2: length} for _ in past))
    # A module is known by its __dict__, not by itself: torch.export's module-stack tracer may call a stand-in for
    # it (torch.fx's AttrProxy, a new object of a subclass that shares the module's __dict__)
    _STEP.names = {id(module.__dict__): name for name, module in model.named_modules()}
    complex_ops.register()  # the complex ops torchlib lacks (rotary built with torch.polar)
    hooks = latent.watch(model)
    try:
        with torch.no_grad(), _placeholders(model):
            program = torch.onnx.export(_Decoder(model), example, dynamo=True, dynamic_shapes=shapes,
                                        input_names=["input_ids", "seqlens_k", "total_sequence_length", "logits_at",
                                                     *past], output_names=["logits", *present],
                                        custom_translation_table={**ops.TRANSLATIONS, **latent.TRANSLATIONS},
                                        optimize=True, verbose=False)
    except Exception as exc:  # the exporter wraps what went wrong; the innermost error is the reason
        raise _refusal(exc) from exc
    finally:
        latent.unwatch(hooks)
    if not _STEP.calls:
        raise OwnAttention("its attention does not run through transformers' attention interface, where the "
                               "generic export puts the engine's (a model with its own attention classes)")
    if len(_STEP.calls) != layers:
        raise UnsupportedModel(f"attention ran in {len(_STEP.calls)} of its {layers} layers (layers without "
                               "attention need a state cache mbuild does not have)")
    if program is None:  # the exporter returns None only when told to write a file
        raise AssertionError("torch.onnx.export returned no program")
    return program.model_proto, list(_STEP.calls), list(_STEP.experts)
