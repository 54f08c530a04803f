"""Where a decode step of an mbuild engine goes: ONNX Runtime's own profiler over decode steps of the runtime's
DecoderEngine (the server's engine, without the server), at one batch, one intra-op thread on the calling thread's
cores; time per step and per op type (QMoE, MatMulNBits, GroupQueryAttention, ...; the LM head's MatMulNBits apart).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort

from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine
from runtimes.kernels import ATTENTION_INPUTS, ATTENTION_INT8_OP, ATTENTION_OP, DOMAIN

HEAD = "lm_head"  # the graph's node name of the LM head (builder/engine/decoder_graph.py)


def _kernel_ms(events: list[dict[str, Any]], start: float, steps: int) -> dict[str, float]:
    """Kernel time per op type per step from `start` (us) on, largest first; the LM head on its own line."""
    spent: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= start:
            node = event["name"].removesuffix("_kernel_time")
            spent["LM head" if node == HEAD else event["args"]["op_name"]] += event["dur"]
    return {op: us / steps / 1000 for op, us in sorted(spent.items(), key=lambda item: -item[1])}


def step_profile(model_dir: Path, batch: int, context: int = 64, steps: int = 8, width: int = 1) -> dict[str, Any]:
    """ms per decode step of `batch` rows each holding `context` tokens (random ids, prefilled one row at a time),
    whole (ONNX Runtime's model_run) and by op type, over `steps` steps after two warm ones. The session is the
    runtime's own (runtimes/engines/sessions.py), with the profiler switched on. width > 1: each step appends that
    many tokens to one row (a speculative verify row; the engine runs a wider row alone) and takes them back."""
    if width > 1 and batch != 1:
        raise ValueError("a step wider than one token runs one row")
    config = load_engine_config(model_dir)
    real = ort.SessionOptions
    with tempfile.TemporaryDirectory() as folder:
        def profiled() -> ort.SessionOptions:
            options = real()
            options.enable_profiling, options.profile_file_prefix = True, str(Path(folder) / "step")
            return options

        with mock.patch("onnxruntime.SessionOptions", profiled):
            engine = DecoderEngine(model_dir, config, threads=1, slots=batch)
        prompts = np.random.default_rng(0).integers(3, config.decoder.vocab_size, (batch, context))
        for row in range(batch):
            engine.run(row, prompts[row:row + 1])
        tokens = np.full((batch, width), 5, np.int64)
        for _ in range(2 + steps):
            engine.run(0, tokens)
            if width > 1:
                engine.truncate(0, context)
        events = json.loads(Path(engine.session.end_profiling()).read_text())
    runs = [event for event in events if event.get("cat") == "Session" and event["name"] == "model_run"][-steps:]
    step_ms = sum(run["dur"] for run in runs) / steps / 1000
    return {"batch": batch, "width": width, "context": context, "steps": steps, "step_ms": step_ms,
            "ops_ms": _kernel_ms(events, runs[0]["ts"], steps)}


def group_query_attention_twin(model_dir: Path, out: Path) -> Path:
    """A copy of an engine folder whose mbuild CausalAttention nodes are ONNX Runtime's GroupQueryAttention again
    (same weights, same int8 cache scales): the before of a step profile, on the same build."""
    from builder.engine.kv_cache_quant import GQA_SCALE_INPUTS, QUANT_ATTRIBUTES

    shutil.copytree(model_dir, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type in (ATTENTION_OP, ATTENTION_INT8_OP):
            int8 = node.op_type == ATTENTION_INT8_OP
            inputs = list(node.input)
            if int8:  # GroupQueryAttention's scales come after position_ids, attention_bias and head_sink
                inputs[ATTENTION_INPUTS:ATTENTION_INPUTS] = [""] * (GQA_SCALE_INPUTS - ATTENTION_INPUTS)
            del node.input[:]
            node.input.extend(inputs)
            node.op_type, node.domain = "GroupQueryAttention", "com.microsoft"
            node.attribute.append(onnx.helper.make_attribute("local_window_size", -1))
            if int8:
                node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in QUANT_ATTRIBUTES.items())
    onnx.save(model, str(out / "model.onnx"))
    return out
