"""Placeholder ops for the trace: where the generic graph needs the runtime's own nodes.

Each is a torch custom op that records its inputs and an integer key in the exported program and computes
nothing worth keeping (zeros of the right shape: the trace needs shapes, not values). torch.onnx's exporter
writes each as a node of DOMAIN (TRANSLATIONS), which rewrite.py replaces: a linear layer by its weights in the
profile's format, the token table by its (8-bit) rows, attention by GroupQueryAttention or mbuild's
CausalAttention over the in-place cache. The schemas below exist only so the exporter can build those nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from onnx.defs import OpSchema, register_schema
from onnxscript.values import Op, Opset

DOMAIN = "mbuild.trace"
LINEAR, EMBEDDING, ATTENTION, EXPERTS, WEIGHT = "Linear", "Embedding", "Attention", "Experts", "Weight"
LEAVES = ("weight", "bias")  # a streamed module's parameters, as WEIGHT's leaf numbers them


@torch.library.custom_op("mbuild_trace::linear", mutates_args=())
def linear(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_zeros((*x.shape[:-1], out_features))


@linear.register_fake
def _(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


@torch.library.custom_op("mbuild_trace::embedding", mutates_args=())
def embedding(ids: torch.Tensor, key: int, width: int) -> torch.Tensor:
    return torch.zeros((*ids.shape, width))


@embedding.register_fake
def _(ids: torch.Tensor, key: int, width: int) -> torch.Tensor:
    return torch.empty((*ids.shape, width))


@torch.library.custom_op("mbuild_trace::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
              seqlens_k: torch.Tensor, total: torch.Tensor, sinks: torch.Tensor,
              key: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, H, S, D], k and v [B, KV, S, D] as transformers' attention takes them -> ([B, S, H, Dv] as it
    returns, the caches as they are after the step). rewrite.py lays them out for the runtime's op."""
    batch, heads, new, _ = q.shape
    return q.new_zeros((batch, new, heads, value_dim)), past_key.clone(), past_value.clone()


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
      seqlens_k: torch.Tensor, total: torch.Tensor, sinks: torch.Tensor,
      key: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads, new, _ = q.shape
    return q.new_empty((batch, new, heads, value_dim)), torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("mbuild_trace::experts", mutates_args=())
def experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, key: int) -> torch.Tensor:
    """A mixture-of-experts layer's experts: [T, H] tokens, each routed to its top_k experts with their weights."""
    return torch.zeros_like(hidden)


@experts.register_fake
def _(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(hidden)


@torch.library.custom_op("mbuild_trace::weight", mutates_args=())
def weight(key: int, leaf: int, shape: list[int]) -> torch.Tensor:
    """A streamed module's parameter, for modeling code that reads it rather than calling the module (key -1: the
    token table's; leaf: its index among the module's parameters). Eagerly, zeros that take no memory."""
    return torch.zeros(()).expand(shape)


@weight.register_fake
def _(key: int, leaf: int, shape: list[int]) -> torch.Tensor:
    return torch.empty(shape)


def _schema(name: str, inputs: str, outputs: int) -> Op:
    """An op of DOMAIN whose inputs are typed by `inputs` (F: a float tensor, I: an integer one) and whose outputs
    are float: the exporter infers the types downstream from these, so an integer input must not make a float
    output look integer."""
    types = [("F", ["tensor(float)"], ""), ("I", ["tensor(int64)", "tensor(int32)"], "")]
    used = [t for t in types if t[0] in inputs or t[0] == "F"]
    attributes = [OpSchema.Attribute(a, OpSchema.AttrType.INT, "") for a in ("key", "leaf")[:1 + (name == WEIGHT)]]
    register_schema(OpSchema(name, DOMAIN, 1,
                             inputs=[OpSchema.FormalParameter(f"in{i}", kind) for i, kind in enumerate(inputs)],
                             outputs=[OpSchema.FormalParameter(f"out{i}", "F") for i in range(outputs)],
                             type_constraints=used, attributes=attributes))
    return Op(Opset(DOMAIN, 1), name)


_LINEAR, _EMBEDDING, _ATTENTION = _schema(LINEAR, "F", 1), _schema(EMBEDDING, "I", 1), _schema(ATTENTION, "FFFFFIIF", 3)
_EXPERTS, _WEIGHT = _schema(EXPERTS, "FIF", 1), _schema(WEIGHT, "", 1)


def _linear_node(x: Any, key: int, out_features: int) -> Any:
    return _LINEAR(x, key=key)


def _embedding_node(ids: Any, key: int, width: int) -> Any:
    return _EMBEDDING(ids, key=key)


def _attention_node(q: Any, k: Any, v: Any, past_key: Any, past_value: Any, seqlens_k: Any, total: Any, sinks: Any,
                    key: int, value_dim: int) -> Any:
    return _ATTENTION(q, k, v, past_key, past_value, seqlens_k, total, sinks, key=key)


def _experts_node(hidden: Any, top_k_index: Any, top_k_weights: Any, key: int) -> Any:
    return _EXPERTS(hidden, top_k_index, top_k_weights, key=key)


def _weight_node(key: int, leaf: int, shape: list[int]) -> Any:
    return _WEIGHT(key=key, leaf=leaf)


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {torch.ops.mbuild_trace.linear.default: _linear_node,
                torch.ops.mbuild_trace.embedding.default: _embedding_node,
                torch.ops.mbuild_trace.attention.default: _attention_node,
                torch.ops.mbuild_trace.experts.default: _experts_node,
                torch.ops.mbuild_trace.weight.default: _weight_node}
