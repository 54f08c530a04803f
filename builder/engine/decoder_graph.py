"""Write a decoder-only language model (Llama, Mistral, Qwen2) as an ONNX graph whose KV cache stays in place.

The graph is built node by node from the checkpoint's tensors, read a block of rows at a time
(checkpoint.py), quantized on the way when the profile asks and written straight to the external-data
file (weight_writer.py): the export holds one block, not the model, and its graph is the engine.
Attention is ONNX Runtime's GroupQueryAttention contrib op with rotary embedding inside it and the past
and present caches sharing one buffer: the runtime binds each slot's preallocated cache [slots, kv_heads,
context, head_dim] as both, and a step writes only its new positions. Each row carries its own length
(seqlens_k), so rows at different lengths decode together and a prompt can be prefilled in chunks on top
of a cache that is already there (chunked prefill, prefix reuse).

Why not onnxruntime-genai's model builder, which makes graphs like this one: it loads the whole model in
PyTorch (its own users report int4 builds running out of memory), and its package requires the
`onnxruntime` distribution, which replaces the `onnxruntime-gpu` one that mbuild's images carry.

Inputs:  input_ids [B,S] int64, seqlens_k [B] int32 (each row's length after this step, minus one),
         total_sequence_length [] int32 (the longest row's), past_key.{i}/past_value.{i} [B,kv,M,d]
Outputs: logits [B,vocab] of each row's last new position, present_key.{i}/present_value.{i} (the same
         buffers as the past ones when the caller binds them so)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from builder.engine.checkpoint import Checkpoint
from builder.engine.weight_writer import (
    BLOCK_BYTES,
    DATA_FILE,
    LinearFormat,
    LinearWriter,
    WeightFile,
    pack_rows,
)
from builder.errors import UnsupportedModel
from builder.model.geometry import HeadGeometry, head_geometry
from builder.planning.precisions import TABLE_BITS, TABLE_BLOCK

# Rope variants whose frequencies change with the sequence length would need the cache rebuilt at run time.
STATIC_ROPE = {"default", "linear", "llama3", "yarn", "proportional"}


def rotary_tables(config: Any, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, head_dim/2] from the model's own rotary class (Llama 3 / YaRN scaling included)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    kind = rope.get("rope_type", "default")
    if kind not in STATIC_ROPE:
        raise UnsupportedModel(f"rope type {kind!r} changes with the sequence length; it is not supported yet")
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    rotary_class = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    rotary = rotary_class(config)
    angles = np.outer(np.arange(positions, dtype=np.float32), rotary.inv_freq.float().numpy())
    if angles.shape[1] != head_dim // 2:
        raise UnsupportedModel(f"partial rotary embeddings ({2 * angles.shape[1]} of {head_dim}) are not supported")
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


class GraphWriter:
    """Nodes and initializers of the decoder; `linear`, `norm` and `embedding` hide the naming and the format."""

    def __init__(self, weights: WeightFile, checkpoint: Checkpoint, eps: float, form: LinearFormat) -> None:
        self.weights, self.checkpoint, self.eps, self.form = weights, checkpoint, eps, form
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
        out = self.node(op, [x, *weights], name, domain="" if op == "MatMul" else "com.microsoft", **attributes)[0]
        if all(f"{p}.bias" in self.checkpoint for p in prefixes):
            bias = np.concatenate([self.checkpoint.get(f"{p}.bias") for p in prefixes])
            out = self.node("Add", [out, self.weights.add(f"{name}.bias", bias)], f"{name}_bias")[0]
        return out

    def norm(self, x: str, weight: str, name: str) -> str:
        scale = self.weights.add(f"{name}.weight", self.checkpoint.get(weight))
        return self.node("SimplifiedLayerNormalization", [x, scale], name, axis=-1, epsilon=self.eps,
                         stash_type=1)[0]

    def embedding(self, ids: str) -> str:
        """The token table, fp32, or for quantized profiles 8-bit in blocks of 32 (llama.cpp's q8_0 layout),
        which an 8B model needs: its table is 2 GB in fp32. Rows are looked up, then widened."""
        source = "model.embed_tokens.weight"
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


@contextmanager
def _opened(model_dir: Path, data_path: Path) -> Iterator[tuple[Checkpoint, WeightFile]]:
    with ExitStack() as stack:
        fd = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        stack.callback(os.close, fd)
        yield Checkpoint(model_dir, stack), WeightFile(fd)


def attention_window(config: Any, layer: int) -> int:
    """GroupQueryAttention's local_window_size for a layer: -1 is full attention."""
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if window and (kinds[layer] == "sliding_attention" if kinds else config.model_type == "mistral"):
        return int(window)
    return -1


def _layer(g: GraphWriter, config: Any, i: int, x: str, dims: HeadGeometry) -> str:
    prefix = f"model.layers.{i}"
    h = g.norm(x, f"{prefix}.input_layernorm.weight", f"layers.{i}.attn_norm")
    qkv = g.linear(h, [f"{prefix}.self_attn.{p}_proj" for p in "qkv"], f"layers.{i}.qkv")
    attention = g.node("GroupQueryAttention", [qkv, "", "", f"past_key.{i}", f"past_value.{i}", "seqlens_k",
                                               "total_sequence_length", "cos_cache", "sin_cache"],
                       f"layers.{i}.attention", outputs=3, domain="com.microsoft", num_heads=dims.heads,
                       kv_num_heads=dims.kv_heads, do_rotary=1, scale=dims.head_dim ** -0.5,
                       local_window_size=attention_window(config, i))
    g.nodes[-1].output[1:] = [f"present_key.{i}", f"present_value.{i}"]
    out = g.linear(attention[0], [f"{prefix}.self_attn.o_proj"], f"layers.{i}.o_proj")
    x = g.node("Add", [x, out], f"layers.{i}.attn_residual")[0]
    h = g.norm(x, f"{prefix}.post_attention_layernorm.weight", f"layers.{i}.mlp_norm")
    gate_up = g.linear(h, [f"{prefix}.mlp.gate_proj", f"{prefix}.mlp.up_proj"], f"layers.{i}.gate_up")
    gate, up = g.node("Split", [gate_up], f"layers.{i}.split", outputs=2, axis=-1, num_outputs=2)
    # SiLU is QuickGelu with alpha 1 (x * sigmoid(x)), the node ONNX Runtime's optimizer would fuse it into
    silu = g.node("QuickGelu", [gate], f"layers.{i}.silu", domain="com.microsoft", alpha=1.0)[0]
    act = g.node("Mul", [silu, up], f"layers.{i}.gated")[0]
    down = g.linear(act, [f"{prefix}.mlp.down_proj"], f"layers.{i}.down_proj")
    return g.node("Add", [x, down], f"layers.{i}.mlp_residual")[0]


def write_decoder(model_dir: Path, config: Any, out_dir: Path, form: LinearFormat | None = None) -> HeadGeometry:
    """model.onnx + model.onnx.data in out_dir, linear layers in `form` (fp32 by default); returns the cache
    dimensions the runtime needs."""
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"activation {config.hidden_act!r} is not supported yet (silu is)")
    dims = head_geometry(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _opened(model_dir, out_dir / DATA_FILE) as (checkpoint, weights):
        g = GraphWriter(weights, checkpoint, float(config.rms_norm_eps), form or LinearFormat())
        cos, sin = rotary_tables(config, dims.head_dim, int(config.max_position_embeddings))
        weights.add("cos_cache", cos)
        weights.add("sin_cache", sin)
        x = g.embedding("input_ids")
        for i in range(dims.layers):
            x = _layer(g, config, i, x, dims)
        last = g.node("Slice", [x, weights.add("last.start", np.array([-1], np.int64)),
                                weights.add("last.end", np.array([np.iinfo(np.int64).max], np.int64)),
                                weights.add("last.axes", np.array([1], np.int64))], "last_position")[0]
        h = g.norm(last, "model.norm.weight", "final_norm")
        head = "lm_head" if "lm_head.weight" in checkpoint else "model.embed_tokens"
        logits = g.linear(h, [head], "lm_head")
        g.node("Squeeze", [logits, weights.add("squeeze.axes", np.array([1], np.int64))], "logits")
        g.nodes[-1].output[0] = "logits"
    _save(g, dims, int(config.vocab_size), out_dir)
    return dims


def _save(g: GraphWriter, dims: HeadGeometry, vocab: int, out_dir: Path) -> None:
    cache: list[str | int] = ["batch", dims.kv_heads, "max_length", dims.head_dim]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "new"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", vocab])]
    for i in range(dims.layers):
        inputs += [helper.make_tensor_value_info(f"past_{kind}.{i}", f32, cache) for kind in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"present_{kind}.{i}", f32, cache) for kind in ("key", "value")]
    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, g.weights.initializers)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mbuild")
    model.ir_version = 9
    onnx.save(model, str(out_dir / "model.onnx"))
