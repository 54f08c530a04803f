"""Write a decoder-only language model as an ONNX graph whose KV cache stays in place.

The graph is built node by node from the checkpoint's tensors, read a block of rows at a time
(checkpoint.py), quantized on the way when the profile asks and written straight to the external-data
file (weight_writer.py): the export holds one block, not the model, and its graph is the engine.
The family's differences from Llama come as an Arch (decoder_family.py); experts as decoder_moe.py writes them.
Attention is ONNX Runtime's GroupQueryAttention contrib op (or, where mbuild's kernel library is built in,
its CausalAttention: runtimes/kernels/attention.cpp) with rotary embedding inside it and the past
and present caches sharing one buffer: the runtime binds each slot's preallocated cache [slots, kv_heads,
context, head_dim] as both, and a step writes only its new positions. Each row carries its own length
(seqlens_k), so rows at different lengths decode together and a prompt can be prefilled in chunks on top
of a cache that is already there (chunked prefill, prefix reuse).

Why not onnxruntime-genai's model builder, which makes graphs like this one: it loads the whole model in
PyTorch (its own users report int4 builds running out of memory), and its package requires the
`onnxruntime` distribution, which replaces the `onnxruntime-gpu` one that mbuild's images carry.

Inputs:  input_ids [B,S] int64, seqlens_k [B] int32 (each row's length after this step, minus one),
         total_sequence_length [] int32 (the longest row's), logits_at [N] int64 (which of the B*S new
         positions, flattened row by row, give logits), past_key.{i}/past_value.{i} [B,kv,M,d]
Outputs: logits [N,vocab] of those positions, present_key.{i}/present_value.{i} (the same
         buffers as the past ones when the caller binds them so)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_family import Arch, arch_of
from builder.engine.rope import rotary_tables
from builder.engine.weight_writer import (
    BLOCK_BYTES,
    DATA_FILE,
    INPUT_ORDER,
    LinearFormat,
    LinearWriter,
    WeightFile,
    pack_rows,
)
from builder.model.geometry import HeadGeometry, head_geometry
from builder.planning.precisions import TABLE_BITS, TABLE_BLOCK
from runtimes.kernels import ATTENTION_HEAD_DIMS, ATTENTION_OP
from runtimes.kernels import DOMAIN as KERNELS_DOMAIN


class GraphWriter:
    """Nodes and initializers of the decoder; `linear`, `norm` and `embedding` hide the naming and the format."""

    def __init__(self, weights: WeightFile, checkpoint: Checkpoint, arch: Arch | None, form: LinearFormat) -> None:
        """`arch` is the fast lane's family (its norms' epsilon and offset); the generic path writes no norms."""
        self.weights, self.checkpoint, self.form = weights, checkpoint, form
        self.eps, self.offset = (arch.eps, arch.norm_offset) if arch else (0.0, 0.0)
        self.nodes: list[onnx.NodeProto] = []
        self.write_linear = LinearWriter(weights, checkpoint, form)

    def node(self, op: str, inputs: list[str], name: str, outputs: int = 1, domain: str = "",
             **attributes: Any) -> list[str]:
        names = [f"{name}/out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=name, domain=domain, **attributes))
        return names

    def linear(self, x: str, prefixes: list[str], name: str) -> str:
        """x @ W.T (+ bias): several projections of the same input fused into one MatMul (q|k|v, gate|up)."""
        op, weights, attributes = self.write_linear([f"{p}.weight" for p in prefixes], name)
        order = attributes.pop(INPUT_ORDER, None)
        if order is not None:  # a kept act-order grid: its blocks hold the input's columns in this order
            x = self.node("Gather", [x, order], f"{name}_input_order", axis=-1)[0]
        attributes = {"domain": "" if op == "MatMul" else "com.microsoft", **attributes}  # mbuild's ops name theirs
        out = self.node(op, [x, *weights], name, **attributes)[0]
        if all(f"{p}.bias" in self.checkpoint for p in prefixes):
            bias = np.concatenate([self.checkpoint.get(f"{p}.bias") for p in prefixes])
            out = self.node("Add", [out, self.weights.add(f"{name}.bias", bias)], f"{name}_bias")[0]
        return out

    def norm(self, x: str, weight: str, name: str) -> str:
        scale = self.weights.add(f"{name}.weight", self.checkpoint.get(weight) + np.float32(self.offset))
        return self.node("SimplifiedLayerNormalization", [x, scale], name, axis=-1, epsilon=self.eps,
                         stash_type=1)[0]

    def head_norm(self, x: str, weight: str, name: str, head_dim: int) -> str:
        """RMSNorm of each head of x [B, S, heads * head_dim] (ONNX Runtime's CPU attention has no q/k norm)."""
        heads = self.node("Reshape", [x, self.weights.add(f"{name}.heads", np.array([0, 0, -1, head_dim]))],
                          f"{name}_heads")[0]
        normed = self.norm(heads, weight, name)
        return self.node("Reshape", [normed, self.weights.add(f"{name}.flat", np.array([0, 0, -1]))], f"{name}_flat")[0]

    def scaled(self, x: str, factor: float, name: str) -> str:
        if factor == 1.0:
            return x
        return self.node("Mul", [x, self.weights.add(f"{name}.factor", np.array(factor, np.float32))], name)[0]

    def embedding(self, ids: str, source: str = "model.embed_tokens.weight") -> str:
        """The token table, fp32, or for quantized profiles 8-bit in blocks of 32 (llama.cpp's q8_0 layout),
        which an 8B model needs: its table is 2 GB in fp32. Rows are looked up, then widened."""
        vocab, hidden = self.checkpoint.shape(source)
        if self.form.kind == "fp32" or hidden % TABLE_BLOCK:
            offset = self.weights.reserve("embed_tokens", (vocab, hidden), np.dtype(np.float32))
            for first, block in self.checkpoint.blocks([source], BLOCK_BYTES):
                self.weights.put(offset + first * hidden * 4, block)
            return self.node("Gather", ["embed_tokens", ids], "embed")[0]
        offset = self.weights.reserve("embed_tokens", (vocab, hidden), np.dtype(np.uint8))
        scales = []
        for first, block in self.checkpoint.blocks([source], BLOCK_BYTES):
            packed, scale = pack_rows(block, TABLE_BITS, TABLE_BLOCK)
            self.weights.put(offset + first * hidden, packed)
            scales.append(scale)
        self.weights.add("embed_tokens.scales", np.concatenate(scales))
        self.weights.add("embed_tokens.zero_points", np.full((vocab, hidden // TABLE_BLOCK), 128, np.uint8))
        return self.node("GatherBlockQuantized", ["embed_tokens", ids, "embed_tokens.scales",
                                                  "embed_tokens.zero_points"], "embed", domain="com.microsoft",
                         bits=TABLE_BITS, block_size=TABLE_BLOCK, gather_axis=0, quantize_axis=1)[0]

    def attention(self, inputs: list[str], i: int, dims: HeadGeometry, scale: float, window: int = -1,
                  softcap: float = 0.0, sinks: str | None = None, rotary: bool = False) -> str:
        """Layer i's attention over its in-place cache: mbuild's CausalAttention where its library is beside the
        graph and the layer needs nothing it lacks (a window, a soft cap, sinks), else GroupQueryAttention.
        `inputs` are GroupQueryAttention's first nine (q, k, v, the caches, lengths, rotary tables)."""
        heads = {"num_heads": dims.heads, "kv_num_heads": dims.kv_heads, "do_rotary": int(rotary)}
        if self.form.tiles and window == -1 and not softcap and not sinks and dims.head_dim in ATTENTION_HEAD_DIMS:
            attention = self.node(ATTENTION_OP, inputs, f"layers.{i}.attention", outputs=3, domain=KERNELS_DOMAIN,
                                  scale=float(scale), **heads)
        else:
            attributes = {"softcap": softcap} if softcap else {}
            extra = ["", "", sinks] if sinks else []  # position_ids and attention_bias come before head_sink
            attention = self.node("GroupQueryAttention", [*inputs, *extra], f"layers.{i}.attention", outputs=3,
                                  domain="com.microsoft", scale=float(scale), local_window_size=window, **heads,
                                  **attributes)
        self.nodes[-1].output[1:] = [f"present_key.{i}", f"present_value.{i}"]
        return attention[0]


@contextmanager
def opened(model_dir: Path, data_path: Path) -> Iterator[tuple[Checkpoint, WeightFile]]:
    with ExitStack() as stack:
        fd = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        stack.callback(os.close, fd)
        yield Checkpoint(model_dir, stack), WeightFile(fd)


def _attention(g: GraphWriter, arch: Arch, i: int, h: str, dims: HeadGeometry) -> str:
    prefix, plan = f"model.layers.{i}.self_attn", arch.layers[i]
    qkv = g.linear(h, [f"{prefix}.{p}" for p in arch.qkv], f"layers.{i}.qkv")
    qkv_inputs = [qkv, "", ""]
    if arch.qk_norm:  # normed before attention, so q, k and v go in apart
        widths = np.array([dims.heads, dims.kv_heads, dims.kv_heads], np.int64) * dims.head_dim
        q, k, v = g.node("Split", [qkv, g.weights.add(f"layers.{i}.qkv.widths", widths)], f"layers.{i}.split_qkv",
                         outputs=3, axis=-1)
        if arch.qk_norm == "head":
            q = g.head_norm(q, f"{prefix}.q_norm.weight", f"layers.{i}.q_norm", dims.head_dim)
            k = g.head_norm(k, f"{prefix}.k_norm.weight", f"layers.{i}.k_norm", dims.head_dim)
        else:
            q = g.norm(q, f"{prefix}.q_norm.weight", f"layers.{i}.q_norm")
            k = g.norm(k, f"{prefix}.k_norm.weight", f"layers.{i}.k_norm")
        qkv_inputs = [q, k, v]
    rope = [f"cos_cache.{plan.rope}", f"sin_cache.{plan.rope}"] if plan.rope else ["", ""]
    sink = g.weights.add(f"layers.{i}.sinks", g.checkpoint.get(f"{prefix}.sinks")) if arch.sinks else None
    inputs = [*qkv_inputs, f"past_key.{i}", f"past_value.{i}", "seqlens_k", "total_sequence_length", *rope]
    out = g.attention(inputs, i, dims, arch.attn_scale, plan.window, arch.attn_softcap, sink, plan.rope is not None)
    return g.linear(out, [f"{prefix}.o_proj"], f"layers.{i}.o_proj")


def _mlp(g: GraphWriter, arch: Arch, i: int, h: str) -> str:
    prefix = f"model.layers.{i}.mlp"
    gate_up = g.linear(h, [f"{prefix}.{p}" for p in arch.gate_up], f"layers.{i}.gate_up")
    gate, up = g.node("Split", [gate_up], f"layers.{i}.split", outputs=2, axis=-1, num_outputs=2)
    if arch.activation == "silu":
        # SiLU is QuickGelu with alpha 1 (x * sigmoid(x)), the node ONNX Runtime's optimizer would fuse it into
        act = g.node("QuickGelu", [gate], f"layers.{i}.silu", domain="com.microsoft", alpha=1.0)[0]
    else:  # FastGelu is gelu's tanh approximation, as gelu_pytorch_tanh computes it
        act = g.node("FastGelu", [gate], f"layers.{i}.gelu", domain="com.microsoft")[0]
    gated = g.node("Mul", [act, up], f"layers.{i}.gated")[0]
    return g.linear(gated, [f"{prefix}.down_proj"], f"layers.{i}.down_proj")


def _block(g: GraphWriter, arch: Arch, i: int, name: str, x: str, norms: tuple[str | None, str | None],
           branch: Callable[[str], str]) -> str:
    """x + scale * out_norm(branch(in_norm(x))), the norms being the family's (none where it has none)."""
    before, after = (f"model.layers.{i}.{n}.weight" if n else None for n in norms)
    h = g.norm(x, before, f"layers.{i}.{name}_norm") if before else x
    out = branch(h)
    if after:
        out = g.norm(out, after, f"layers.{i}.{name}_post_norm")
    out = g.scaled(out, arch.residual_scale, f"layers.{i}.{name}_scale")
    return g.node("Add", [x, out], f"layers.{i}.{name}_residual")[0]


def _layer(g: GraphWriter, arch: Arch, config: Any, i: int, x: str, dims: HeadGeometry) -> str:
    norms = arch.norms
    x = _block(g, arch, i, "attn", x, (norms.attn_in, norms.attn_out), lambda h: _attention(g, arch, i, h, dims))
    if arch.layers[i].moe:
        from builder.engine.decoder_moe import moe_block  # it builds on GraphWriter: imported here, not above

        def ffn(h: str) -> str:
            return moe_block(g, config, i, h)
    else:
        def ffn(h: str) -> str:
            return _mlp(g, arch, i, h)
    return _block(g, arch, i, "mlp", x, (norms.mlp_in, norms.mlp_out), ffn)


def _head(g: GraphWriter, arch: Arch, x: str) -> None:
    """The logits of the positions logits_at picks from the flattened [B*S] ones (a prompt chunk's last, a verify
    row's every one): final norm, LM head (tied or not), Granite's scaling, Gemma 2's soft cap. Picking before the
    head keeps its cost to the rows asked for: all 512 positions of a chunk through a 128k-vocabulary head would cost
    more than the chunk."""
    weights = g.weights
    hidden = g.checkpoint.shape("model.norm.weight")[0]
    flat = g.node("Reshape", [x, weights.add("flat.shape", np.array([-1, hidden], np.int64))], "flat_positions")[0]
    picked = g.node("Gather", [flat, "logits_at"], "picked_positions", axis=0)[0]
    h = g.norm(picked, "model.norm.weight", "final_norm")
    head = "lm_head" if "lm_head.weight" in g.checkpoint else "model.embed_tokens"
    logits = g.scaled(g.linear(h, [head], "lm_head"), arch.logits_scale, "logits_scale")
    if arch.final_softcap:
        cap = weights.add("final_softcap", np.array(arch.final_softcap, np.float32))
        capped = g.node("Tanh", [g.node("Div", [logits, cap], "softcap_div")[0]], "softcap_tanh")[0]
        logits = g.node("Mul", [capped, cap], "softcap")[0]
    g.node("Identity", [logits], "logits")
    g.nodes[-1].output[0] = "logits"


def write_decoder(model_dir: Path, config: Any, out_dir: Path, form: LinearFormat | None = None) -> HeadGeometry:
    """model.onnx + model.onnx.data in out_dir, linear layers in `form` (fp32 by default); returns the cache
    dimensions the runtime needs."""
    arch = arch_of(config)
    dims = head_geometry(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    with opened(model_dir, out_dir / DATA_FILE) as (checkpoint, weights):
        g = GraphWriter(weights, checkpoint, arch, form or LinearFormat())
        for key, (cos, sin) in rotary_tables(config, dims.head_dim, arch.rope_keys()).items():
            weights.add(f"cos_cache.{key}", cos)
            weights.add(f"sin_cache.{key}", sin)
        x = g.scaled(g.embedding("input_ids"), arch.embed_scale, "embed_scale")
        for i in range(dims.layers):
            x = _layer(g, arch, config, i, x, dims)
        _head(g, arch, x)
    _save(g, dims, int(config.vocab_size), out_dir)
    return dims


def _save(g: GraphWriter, dims: HeadGeometry, vocab: int, out_dir: Path) -> None:
    save_decoder(g.nodes, g.weights.initializers, dims, vocab, out_dir, opset=18)


def save_decoder(nodes: list[onnx.NodeProto], initializers: list[TensorProto], dims: HeadGeometry, vocab: int,
                 out_dir: Path, opset: int, metadata: dict[str, str] | None = None) -> None:
    """model.onnx with the decoder's inputs and outputs (the module docstring); `opset`: the default domain's;
    `metadata`: what the engine reads from the graph (runtimes/engines/decoder.py's entries)."""
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "new"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("logits_at", TensorProto.INT64, ["picked"])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["picked", vocab])]
    for i, (kv_heads, head_dim) in enumerate(dims.shapes):  # each layer's own cache
        cache: list[str | int] = ["batch", kv_heads, "max_length", head_dim]
        inputs += [helper.make_tensor_value_info(f"past_{kind}.{i}", f32, cache) for kind in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"present_{kind}.{i}", f32, cache) for kind in ("key", "value")]
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    if any(node.domain == KERNELS_DOMAIN for node in nodes):
        opsets.append(helper.make_opsetid(KERNELS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mbuild")
    model.ir_version = 9
    helper.set_model_props(model, metadata or {})
    onnx.save(model, str(out_dir / "model.onnx"))
