"""A traced experts placeholder (trace.ExpertsCall) as decoder_moe.expert_node writes experts (ONNX Runtime's MoE or
QMoE, or mbuild's ExpertsInt8Tiles): the fast lane's expert writer (decoder_moe.ProjectionWriter, one expert in
memory at a time), fed from the checkpoint's fused tensors ([E, 2I, H], gate rows then up rows) or its per-expert ones.

The routing stays transformers' (grouped top-k, score-correction biases, sigmoid or softmax scores, scaling:
whatever the router's code does is traced). MoE routes by itself, from router logits [T, E] it softmaxes
before its top-k; given log(w) at the chosen experts and -1e30 elsewhere, it picks exactly those, weighted
w / sum(w), and the block's output is scaled back by sum(w): a mixture of experts is linear in its weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import helper

from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_graph import GraphWriter
from builder.engine.decoder_moe import SILU_GATE, ProjectionWriter, Rows, Scheme, expert_node
from builder.engine.generic.trace import ExpertsCall
from builder.engine.layer_weights import per_expert
from builder.errors import UnsupportedModel

MASKED = -1e30  # the log weight of an expert not chosen: nothing after softmax


def _expert_rows(checkpoint: Checkpoint, stored: dict[str, str], call: ExpertsCall, leaf: str,
                 e: int) -> np.ndarray:
    """Expert e's rows of a projection as nn.Linear holds them ([2I, H] gate then up, or [H, I])."""
    name = f"{call.module}.{leaf}"
    source = stored.get(name, name)
    if source in checkpoint:
        rows = checkpoint.rows(source, e, e + 1)[0]
        return np.ascontiguousarray(rows.T) if call.transposed else rows
    parts = per_expert(checkpoint, name, call.count)
    if parts is None:
        raise UnsupportedModel(f"the checkpoint lacks {name!r} and any per-expert tensors of it",
                               hint="is it a complete download?")
    return np.concatenate([checkpoint.get(part) for part in parts[e]])


def _fc1(rows: np.ndarray, inter: int) -> Rows:
    """Gate rows then up rows -> interleaved, as MoE's swiglu_fusion=1 reads them."""
    out = np.empty_like(rows)
    out[0::2], out[1::2] = rows[:inter], rows[inter:]
    yield 0, out


def _one(rows: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    yield 0, rows


def _biases(g: GraphWriter, stored: dict[str, str], call: ExpertsCall, name: str) -> tuple[str, str]:
    if not call.biased:
        return "", ""
    up = g.checkpoint.get(stored.get(f"{call.module}.gate_up_proj_bias", f"{call.module}.gate_up_proj_bias"))
    woven = np.empty_like(up)
    woven[:, 0::2], woven[:, 1::2] = up[:, :call.inter], up[:, call.inter:]
    down = g.checkpoint.get(stored.get(f"{call.module}.down_proj_bias", f"{call.module}.down_proj_bias"))
    return g.weights.add(f"{name}.fc1.bias", woven), g.weights.add(f"{name}.fc2.bias", down)


def write_experts(g: GraphWriter, node: onnx.NodeProto, call: ExpertsCall, stored: dict[str, str]) -> None:
    hidden, index, weights = node.input
    name = call.module
    scheme = Scheme.of(g.form, call.hidden, call.inter)
    fc1 = ProjectionWriter(g, f"{name}.fc1", (call.count, 2 * call.inter, call.hidden), scheme)
    fc2 = ProjectionWriter(g, f"{name}.fc2", (call.count, call.hidden, call.inter), scheme)
    for e in range(call.count):
        fc1.write(e, _fc1(_expert_rows(g.checkpoint, stored, call, "gate_up_proj", e), call.inter))
        fc2.write(e, _one(_expert_rows(g.checkpoint, stored, call, "down_proj", e)))
    bias1, bias2 = _biases(g, stored, call, name)
    tokens = g.node("Shape", [hidden], f"{name}/tokens", start=0, end=1)[0]
    width = g.weights.add(f"{name}.count", np.array([call.count], np.int64))
    shape = g.node("Concat", [tokens, width], f"{name}/logits_shape", axis=0)[0]
    masked = helper.make_tensor("value", onnx.TensorProto.FLOAT, [1], [MASKED])
    base = g.node("ConstantOfShape", [shape], f"{name}/masked", value=masked)[0]
    logw = g.node("Log", [weights], f"{name}/log_weights")[0]
    logits = g.node("ScatterElements", [base, index, logw], f"{name}/router_logits", axis=1)[0]
    attributes: dict[str, Any] = {"activation_type": "swiglu", "swiglu_fusion": 1, "k": call.top_k,
                                  "normalize_routing_weights": 1,
                  **SILU_GATE}
    out = expert_node(g, name, [hidden, logits], (fc1, fc2), (bias1, bias2), attributes, call.inter)
    axis = g.weights.add(f"{name}.last_axis", np.array([-1], np.int64))
    total = g.node("ReduceSum", [weights, axis], f"{name}/weight_sum", keepdims=1)[0]
    g.nodes.append(helper.make_node("Mul", [out, total], [node.output[0]], name=f"{name}/scaled"))
