"""An 8-bit KV cache for an in-place decoder graph: scales calibrated on the engine's own cache, then the graph's
attention nodes told to keep int8 keys and values (GroupQueryAttention, or mbuild's CausalAttention, which keeps
them the same way: runtimes/kernels/attention.cpp).

ONNX Runtime 1.32's CPU GroupQueryAttention quantizes what it writes to present_key/present_value with a static
scale per KV head and channel (k_scale/v_scale [kv_heads, 1, head_dim], `k_quant_type`/`v_quant_type`
PER_CHANNEL, `kv_cache_bit_width` 8), saturating at -128..127 (measured: values 9x past the range came back as 127
and -128, none wrapped). Its scales are graph inputs, here constants, so they are calibrated at build time: the fp32
cache the engine itself writes for calibration text (keys after rotary, as the kernel stores them) gives each
channel's largest magnitude. A rotary pair's two channels trade magnitude with position, so a key channel takes the
larger of its pair's; HEADROOM leaves room for values past what the text showed. What this costs in accuracy is
for the gate to say.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from tokenizers import Tokenizer

from builder.errors import ValidationFailed
from builder.planning.profiles import Tolerance
from runtimes.bundle import load_engine_config
from runtimes.bundle.codec import write_contract
from runtimes.bundle.report import CacheCheck, DecoderReport, read_gate_report
from runtimes.engines.decoder import DecoderEngine
from runtimes.kernels import ATTENTION_INPUTS, ATTENTION_INT8_OP, ATTENTION_OP
from runtimes.kernels import DOMAIN as KERNELS_DOMAIN

# Beyond the largest calibration value, before saturation. Measured on the trained tiny Llama (64 greedy tokens after
# 5 prompts, scales from its training text): largest logit error 2.28 at 1x, 0.92 at 1.25x (values past the text's
# saturated), 0.10 at 2x, 0.11 at 4x, 0.28 at 8x (coarser steps); every greedy token equal at each.
HEADROOM = 2.0
GQA_SCALE_INPUTS = 12  # k_scale and v_scale follow GroupQueryAttention's 12 other inputs (ORT 1.32's schema)
QUANT_ATTRIBUTES = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}


def calibrate(engine_dir: Path, prompts: Sequence[Sequence[int]], threads: int = 0) -> list[np.ndarray]:
    """Per layer and kind (the engine's past order: key.0, value.0, ...), a [kv_heads, 1, head_dim] scale: the fp32
    cache's largest magnitude per channel over the prompts, rotary pairs joined for keys, with HEADROOM, / 127."""
    config = load_engine_config(engine_dir)
    engine = DecoderEngine(engine_dir, config, threads, slots=1)
    if engine.kv_dtype != np.float32 or not engine.in_place:
        raise ValueError(f"calibration reads an fp32 in-place cache; {engine_dir} keeps {engine.kv_dtype}")
    top = [np.zeros((buffer.shape[1], buffer.shape[3]), np.float32) for buffer in engine.cache]  # each layer's
    for prompt in prompts:
        ids = list(prompt)[:engine.context]
        engine.run(0, np.array([ids], np.int64))
        for seen, buffer in zip(top, engine.cache, strict=True):
            np.maximum(seen, np.abs(buffer[0, :, :len(ids)]).max(axis=1), out=seen)
        engine.release(0)
    scales: list[np.ndarray] = []
    for i, (name, seen) in enumerate(zip(engine.past, top, strict=True)):
        if i and engine.cache[i] is engine.cache[i - 1]:  # values that are the keys, in the keys' buffer: one scale
            scales.append(scales[-1])
            continue
        if name.startswith("past_key"):  # channel c turns with c + d/2 (rotate-half rotary)
            seen = np.maximum(seen, np.roll(seen, seen.shape[1] // 2, axis=1))
        scales.append((np.maximum(seen, 1e-6) * HEADROOM / 127).astype(np.float32)[:, None, :])
    return scales


def _attention_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's attention nodes, GroupQueryAttention or mbuild's CausalAttention (either cache form)."""
    ours = {ATTENTION_OP, ATTENTION_INT8_OP}
    return [n for n in graph.node if (n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft")
            or (n.op_type in ours and n.domain == KERNELS_DOMAIN)]


def _scale_inputs(node: onnx.NodeProto) -> int:
    """Where k_scale and v_scale go in the node's inputs."""
    return GQA_SCALE_INPUTS if node.op_type == "GroupQueryAttention" else ATTENTION_INPUTS


def quantize_graph(model_path: Path, scales: Sequence[np.ndarray]) -> None:
    """Rewrite model.onnx (its external weights untouched) to keep an int8 cache with these scales."""
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    nodes = _attention_nodes(graph)
    if len(nodes) * 2 != len(scales):
        raise ValueError(f"{model_path} has {len(nodes)} attention nodes for {len(scales)} cache scales")
    for node in nodes:
        layer = int(node.input[3].rsplit(".", 1)[1])  # past_key.{layer}: the engine's past order
        names = [f"kv_scale.{node.input[3]}", f"kv_scale.{node.input[4]}"]
        for name, scale in zip(names, scales[2 * layer:2 * layer + 2], strict=True):
            graph.initializer.append(numpy_helper.from_array(scale, name))
        inputs = list(node.input) + [""] * (_scale_inputs(node) - len(node.input))
        del node.input[:]
        node.input.extend([*inputs, *names])
        if node.op_type == "GroupQueryAttention":
            node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in QUANT_ATTRIBUTES.items())
        else:
            node.op_type = ATTENTION_INT8_OP
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past_", "present_")):
            value.type.tensor_type.elem_type = TensorProto.INT8
    onnx.save(model, str(model_path))


def fp32_cache_graph(model_path: Path) -> None:
    """Undo quantize_graph in place: the graph keeps an fp32 cache again. The build keeps the fp32 graph's bytes
    itself; this is for a folder that shipped int8 and must be compared with its fp32 cache (bench)."""
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    scales = {i.name for i in graph.initializer if i.name.startswith("kv_scale.")}
    for node in _attention_nodes(graph):
        if set(node.input) & scales:
            inputs = list(node.input)[:_scale_inputs(node)]
            while inputs and not inputs[-1]:  # the optional inputs quantize_graph padded with
                inputs.pop()
            del node.input[:]
            node.input.extend(inputs)
            kept = [a for a in node.attribute if a.name not in QUANT_ATTRIBUTES]
            del node.attribute[:]
            node.attribute.extend(kept)
            if node.op_type == ATTENTION_INT8_OP:
                node.op_type = ATTENTION_OP
    kept_initializers = [i for i in graph.initializer if i.name not in scales]
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past_", "present_")):
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    onnx.save(model, str(model_path))


# Calibration text: prose, a conversation, code and numbers, so each channel sees the ranges text of each kind gives.
CALIBRATION = (
    "The committee met on Tuesday to review the budget, and after a long discussion it approved the plan.",
    "User: Can you explain how a hash table handles collisions? Assistant: Most implementations chain entries",
    "def merge(left, right):\n    out = []\n    while left and right:\n        out.append(min(left, right))\n",
    "Revenue grew 12.5% to $4,210 million in 2024, while costs fell from 3,870 to 3,655 (see Table 2).",
    "Die Katze schläft auf dem Sofa. Le chat dort sur le canapé. 猫はソファで寝ています。",
)


def int8_cache_gate(snapshot: Path, engine_dir: Path, tolerance: Tolerance, report_path: Path,
                    fp32: DecoderReport) -> DecoderReport:
    """The engine (already gated with its fp32 cache: `fp32`) given an int8 cache and gated again; its report
    holds both. An int8 cache that fails is taken out again: the engine keeps its fp32 cache, within the bytes the
    plan gave the KV pool (engine.json's batching.kv_cache_bytes: a quarter of the tokens), and the report holds
    the failed gate's numbers, so the build ships what passed instead of failing on what was only an option."""
    from builder.engine.validate_decoder import run_gate  # the gate imports transformers' reference lazily

    model = engine_dir / "model.onnx"
    graph = model.read_bytes()  # the graph alone (its weights are external): the fp32 cache's, kept to go back to
    tokenizer = Tokenizer.from_file(str(engine_dir / load_engine_config(engine_dir).tokenizer_file))
    quantize_graph(model, calibrate(engine_dir, [tokenizer.encode(t).ids for t in CALIBRATION]))
    try:
        report = run_gate(snapshot, engine_dir, tolerance, report_path)
    except ValidationFailed:
        model.write_bytes(graph)
        failed = read_gate_report(json.loads(report_path.read_text()))  # run_gate wrote it before raising
        if not isinstance(failed, DecoderReport):
            raise
        kept = dataclasses.replace(fp32, int8_cache=_check(failed),
                                   summary=f"{fp32.summary} (fp32 KV cache: an int8 one failed the gate, top-1 "
                                           f"{failed.top1_agreement:.3f}, max logit error "
                                           f"{failed.max_logit_error:.3f})")
        write_contract(report_path, kept)
        return kept
    final = dataclasses.replace(report, kv_cache="int8", fp32_cache=_check(fp32),
                                summary=f"{report.summary} (int8 KV cache; fp32 cache: top-1 "
                                        f"{fp32.top1_agreement:.3f}, max logit error {fp32.max_logit_error:.3f})")
    write_contract(report_path, final)
    return final


def _check(report: DecoderReport) -> CacheCheck:
    return CacheCheck(report.greedy_equal, report.top1_agreement, report.max_logit_error)
