"""The traced graph (trace.py) made the engine: each placeholder replaced by the runtime's node, its weights
streamed from the checkpoint into model.onnx.data by the fast lane's own writer (decoder_graph.GraphWriter:
the profile's linear format, the 8-bit token table, the attention over the in-place cache)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_graph import GraphWriter, opened, save_decoder
from builder.engine.dequant import Grid
from builder.engine.generic import latent, ops
from builder.engine.generic.experts import write_experts
from builder.engine.generic.grown import save_grown
from builder.engine.generic.skeleton import Streamed, Streams
from builder.engine.generic.trace import AttentionCall, ExpertsCall
from builder.engine.weight_writer import DATA_FILE, LinearFormat, LinearWriter
from builder.errors import UnsupportedModel
from builder.model.geometry import HeadGeometry
from runtimes.engines.decoder import VALUES_ARE_KEYS


class _Transposed:
    """The checkpoint as LinearWriter reads it, but one weight stored [in, out] (GPT-2's Conv1D) read as nn.Linear's
    [out, in]: whole, as one layer's matrix is (GPT-2 XL's largest, 41 MB in fp32)."""

    def __init__(self, checkpoint: Checkpoint, name: str) -> None:
        self.checkpoint, self.name = checkpoint, name

    def shape(self, name: str) -> tuple[int, ...]:
        found = self.checkpoint.shape(name)
        return tuple(reversed(found)) if name == self.name else found

    def grid(self, name: str) -> Grid | None:
        """A Conv1D weight is no pre-quantized grid: it is read transposed, as rows."""
        return None if name == self.name else self.checkpoint.grid(name)

    def blocks(self, names: list[str], max_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
        first = 0
        for name in names:
            if name == self.name:
                yield first, np.ascontiguousarray(self.checkpoint.get(name).T)
                first += self.shape(name)[0]
            else:
                for at, block in self.checkpoint.blocks([name], max_bytes):
                    yield first + at, block
                first += self.checkpoint.shape(name)[0]


def _linear(g: GraphWriter, x: str, source: Streamed, fp32: bool = False) -> str:
    """The linear layer's node(s) by the fast lane's writer, reading a transposed weight through _Transposed;
    `fp32` keeps it unquantized whatever the profile."""
    if not source.transposed and not fp32:
        return g.linear(x, [source.weight.removesuffix(".weight")], source.module)
    kept = g.write_linear
    reader = _Transposed(g.checkpoint, source.weight) if source.transposed else g.checkpoint
    g.write_linear = LinearWriter(g.weights, reader, LinearFormat() if fp32 else g.form)  # type: ignore[arg-type]
    try:
        return g.linear(x, [source.weight.removesuffix(".weight")], source.module)
    finally:
        g.write_linear = kept


def _siblings(graph: onnx.GraphProto, linears: list[Streamed], kept_fp32: set[int]) -> dict[int, list[int]]:
    """Linear layers of one input (q, k and v; gate and up), by the first one's key: one MatMul reads the input
    once for them all, as the fast lane's q|k|v and gate|up do (at one stream a MatMul call's fixed cost is what
    separate ones add: 0.8x of the fast lane's tokens/s on a 1B Llama, docs/benchmarks/llm_generic.md). Only
    linears the writer reads alike join: none transposed or kept fp32, all with a bias or none."""
    groups: dict[str, list[int]] = {}
    for node in graph.node:
        if node.domain == ops.DOMAIN and node.op_type == ops.LINEAR:
            key = _key(node)
            if not linears[key].transposed and key not in kept_fp32:
                groups.setdefault(node.input[0], []).append(key)
    return {keys[0]: keys for keys in groups.values() if len(keys) > 1}


def _merged(g: GraphWriter, node: onnx.NodeProto, keys: list[int], linears: list[Streamed],
            outputs: dict[int, str]) -> bool:
    """The sibling linears' one MatMul and the Split into each placeholder's output; False where their biases
    differ (one with, one without), which the writer's fused linear cannot hold."""
    prefixes = [linears[k].weight.removesuffix(".weight") for k in keys]
    if len({f"{p}.bias" in g.checkpoint for p in prefixes}) > 1:
        return False
    widths = np.array([g.checkpoint.shape(linears[k].weight)[0] for k in keys], np.int64)
    out = g.linear(node.input[0], prefixes, linears[keys[0]].module)
    split = onnx.helper.make_node("Split", [out, g.weights.add(f"{linears[keys[0]].module}.widths", widths)],
                                  [outputs[k] for k in keys], name=f"{linears[keys[0]].module}.split", axis=-1)
    g.nodes.append(split)
    return True


def _once(graph: onnx.GraphProto, linears: list[Streamed]) -> None:
    """Each linear layer and experts block runs once a step: one whose weights the modeling code runs again in a
    loop (HRM's recurrent modules) would be written twice, which no ONNX graph holds."""
    seen: set[tuple[str, int]] = set()
    for node in graph.node:
        if node.domain == ops.DOMAIN and node.op_type in (ops.LINEAR, ops.EXPERTS):
            key = (node.op_type, _key(node))
            if key in seen:
                what = linears[key[1]].module if node.op_type == ops.LINEAR else "an experts block"
                raise UnsupportedModel(f"its modeling code runs {what} more than once a step (a loop over shared "
                                       "layers), which the generic export does not write")
            seen.add(key)


def _routers(graph: onnx.GraphProto) -> set[int]:
    """The linear layers an experts block's routing is computed from: walking back from its chosen experts and
    weights to the first linear on each path, never past the block's own input. They stay fp32 in every profile,
    as the fast lane's routers do: a rounded logit can pick another expert."""
    made = {out: node for node in graph.node for out in node.output}
    found: set[int] = set()
    for block in (n for n in graph.node if n.domain == ops.DOMAIN and n.op_type == ops.EXPERTS):
        hidden, todo, seen = block.input[0], list(block.input[1:]), set()
        while todo:
            name = todo.pop()
            node = made.get(name)
            if name == hidden or name in seen or node is None:
                continue
            seen.add(name)
            if node.domain == ops.DOMAIN and node.op_type == ops.LINEAR:
                found.add(_key(node))
            else:
                todo.extend(node.input)
    return found


def _name_last(g: GraphWriter, out: str, name: str) -> None:
    """The writer's last node, which made `out`, writes the placeholder's output instead."""
    last = g.nodes[-1]
    assert last.output[0] == out, (last.name, out)
    last.output[0] = name


def _key(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "key")


def _attention(g: GraphWriter, node: onnx.NodeProto, call: AttentionCall, layer: int, dims: HeadGeometry,
               sinks: dict[str, onnx.TensorProto]) -> None:
    """The runtime's attention for a placeholder: q, k, v from transformers' [B, heads, S, D] to [B, S, heads * D]
    and the output back to [B, S, heads, D]."""
    q, k, v, past_key, past_value, seqlens, total, sink = node.input
    flat = g.weights.add(f"layers.{layer}.flat", np.array([0, 0, -1], np.int64))
    qkv = [g.node("Reshape", [g.node("Transpose", [x], f"layers.{layer}.{n}_t", perm=[0, 2, 1, 3])[0], flat],
                  f"layers.{layer}.{n}_flat")[0] for n, x in (("q", q), ("k", k), ("v", v))]
    sink_name = None
    if call.sinks:
        sink_name = g.weights.add(f"layers.{layer}.sinks", numpy_helper.to_array(sinks[sink]))
    inputs = [*qkv, past_key, past_value, seqlens, total, "", ""]
    out = g.attention(inputs, layer, dims.layer(layer), call.scale, call.window, call.softcap, sink_name)
    heads = g.weights.add(f"layers.{layer}.heads", np.array([0, 0, call.heads, call.value_dim], np.int64))
    g.nodes.append(onnx.helper.make_node("Reshape", [out, heads], [node.output[0]], name=f"layers.{layer}.heads"))


def _stored_weight(g: GraphWriter, node: onnx.NodeProto, linears: list[Streamed], table: Streamed) -> None:
    """A streamed parameter the modeling code reads itself (trace.readable_weights): fp32, as it is stored, since
    the code's own arithmetic on it is what the graph computes (the profile's format applies to its module's
    calls). The exporter drops the ones nothing read."""
    key, leaf = _key(node), next(a.i for a in node.attribute if a.name == "leaf")
    weight = (table if key < 0 else linears[key]).weight
    name = weight if leaf == 0 else f"{weight.removesuffix('.weight')}.{ops.LEAVES[leaf]}"
    stored = g.weights.add(f"{name}.read", np.asarray(g.checkpoint.get(name), np.float32))
    g.nodes.append(onnx.helper.make_node("Identity", [stored], [node.output[0]], name=f"{name}.read"))


@dataclass(frozen=True)
class Traced:
    """What the trace found: each layer's attention and each experts block, the cache's dimensions, the vocabulary."""

    calls: list[AttentionCall]
    experts: list[ExpertsCall]
    dims: HeadGeometry
    vocab: int


def rewrite(model: onnx.ModelProto, model_dir: Path, out_dir: Path, streams: Streams, traced: Traced,
            form: LinearFormat) -> None:
    """model.onnx and model.onnx.data in out_dir from the traced graph."""
    linears, dims = streams.linears, traced.dims
    graph = model.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    constants = {t.name: t for t in graph.initializer}
    # the trace's names for the placeholders' caches -> the runtime's buffers, which the attention writes in place
    presents: dict[str, str] = {}
    _once(graph, linears)
    routers = _routers(graph)
    siblings = _siblings(graph, linears, routers)
    outputs = {_key(n): n.output[0] for n in graph.node if n.domain == ops.DOMAIN and n.op_type == ops.LINEAR}
    merged: set[int] = set()
    with opened(model_dir, out_dir / DATA_FILE) as (checkpoint, weights):
        checkpoint.parts.update(streams.parts)
        g = GraphWriter(weights, checkpoint, None, form)
        for node in graph.node:
            if node.domain != ops.DOMAIN:
                g.nodes.append(node)
            elif node.op_type == ops.LINEAR:
                key = _key(node)
                if key in merged:
                    continue
                if key in siblings and _merged(g, node, siblings[key], linears, outputs):
                    merged.update(siblings[key])
                    continue
                _name_last(g, _linear(g, node.input[0], linears[key], fp32=key in routers), node.output[0])
            elif node.op_type == ops.EMBEDDING:
                _name_last(g, g.embedding(node.input[0], streams.embedding.weight), node.output[0])
            elif node.op_type == latent.ABSORB:
                latent.write_absorb(g, node, linears[_key(node)].weight, dims.heads)
            elif node.op_type == ops.EXPERTS:
                write_experts(g, node, traced.experts[_key(node)], streams.stored)
            elif node.op_type == ops.WEIGHT:
                _stored_weight(g, node, linears, streams.embedding)
            else:
                layer = _key(node)
                _attention(g, node, traced.calls[layer], layer, dims, constants)
                presents.update({node.output[1]: f"present_key.{layer}", node.output[2]: f"present_value.{layer}"})
        for node in g.nodes:
            node.input[:] = [presents.get(name, name) for name in node.input]
        # an Identity the exporter put between a placeholder's cache and the graph's output copies it onto itself now
        kept = [n for n in g.nodes if not (n.op_type == "Identity" and n.input[0] == n.output[0])]
        read = {name for node in kept for name in node.input}
        for tensor in graph.initializer:
            if tensor.name in read:
                weights.add(tensor.name, numpy_helper.to_array(tensor))
    if any(i.name == "attention_mask" for i in graph.input):  # the grown-cache form keeps the trace's inputs
        save_grown(kept, weights.initializers, model, out_dir)
    else:
        shared = [str(layer) for layer, call in enumerate(traced.calls) if call.values_are_keys]
        save_decoder(kept, weights.initializers, dims, traced.vocab, out_dir, opset,
                     {VALUES_ARE_KEYS: ",".join(shared)} if shared else None)
