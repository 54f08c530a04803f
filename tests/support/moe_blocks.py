"""One mixture-of-experts block (decoder_moe.moe_block) alone in a graph, beside transformers' own module loaded from
the same tiny random checkpoint: what the expert tests build, run and compare (tests/unit/builder/engine/
test_decoder_moe.py for ONNX Runtime's MoE and QMoE, tests/integration/test_experts_kernel.py for mbuild's
ExpertsInt8Tiles)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from transformers import AutoModelForCausalLM

from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_family import arch_of
from builder.engine.decoder_graph import GraphWriter
from builder.engine.decoder_moe import moe_block
from builder.engine.weight_writer import DATA_FILE, LinearFormat, WeightFile
from runtimes.kernels import DOMAIN
from tests.support.family_configs import family_configs

KINDS = ("mixtral", "qwen3_moe", "gpt_oss")


def config_of(kind: str, **changes: Any) -> Any:
    config = family_configs()[kind]
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def build_block(folder: Path, config: Any, layer: int, form: LinearFormat, out: Path) -> Path:
    """model.onnx in `out`: x [batch, seq, H] -> moe_block -> y."""
    out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack, open(out / DATA_FILE, "wb") as data:
        g = GraphWriter(WeightFile(data.fileno()), Checkpoint(folder, stack), arch_of(config), form)
        g.node("Identity", [moe_block(g, config, layer, "x")], "out")
        g.nodes[-1].output[0] = "y"
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", int(config.hidden_size)]) for n in "xy")
    graph = helper.make_graph(g.nodes, "moe", [x], [y], g.weights.initializers)
    opsets = [helper.make_opsetid(d, v) for d, v in (("", 18), ("com.microsoft", 1), (DOMAIN, 1))]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    onnx.save(model, str(out / "model.onnx"))
    return out / "model.onnx"


def session(path: Path, library: str | None = None, threads: int = 1,
            entries: dict[str, str] | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for key, value in (entries or {}).items():
        options.add_session_config_entry(key, value)
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_block(path: Path, x: np.ndarray, library: str | None = None) -> np.ndarray:
    return np.asarray(session(path, library).run(None, {"x": x})[0])


def module_of(folder: Path, layer: int, **changes: Any) -> Any:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **changes).eval()
    return model.model.layers[layer].mlp


def reference(module: Any, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = module(torch.from_numpy(x))
    return (out[0] if isinstance(out, tuple) else out).numpy()  # gpt-oss's MLP returns its router scores too


def sample_x(hidden: int, tokens: int = 5, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, tokens, hidden)).astype(np.float32)


def initializers(model: Path) -> dict[str, np.ndarray]:
    found = onnx.load(str(model), load_external_data=False).graph.initializer
    return {t.name: numpy_helper.to_array(t, base_dir=str(model.parent)) for t in found}


def load_experts(module: Any, kind: str, fc1: np.ndarray, fc2: np.ndarray) -> None:
    """fc1 [E, 2I, H] (gate, up interleaved) and fc2 [E, H, I] into transformers' expert parameters."""
    experts = module.experts
    if kind == "gpt_oss":
        gate_up, down = fc1.transpose(0, 2, 1), fc2.transpose(0, 2, 1)
    else:
        gate_up, down = np.concatenate([fc1[:, 0::2], fc1[:, 1::2]], axis=1), fc2
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.from_numpy(np.ascontiguousarray(gate_up)))
        experts.down_proj.copy_(torch.from_numpy(np.ascontiguousarray(down)))


def relative_error(y: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
