"""CPU compile of exported encoders: quantization where the profile asks for it, then ONNX Runtime's graph optimizer.

Both run once at build time and the result is saved as the engine. int8: dynamic quantization (int8
weights, activations at run time), the FFN down-projections kept in fp32 (below). Language models do not
pass here: their export writes the engine, quantized as it reads the checkpoint (weight_writer.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from builder.errors import InputError
from builder.planning.engine_options import ort_options
from builder.planning.profiles import Profile
from runtimes.bundle.engine import ENCODER_TASKS

# That module calls logging.basicConfig(level=INFO) on import, which would print every library's INFO
# lines (quantizer, sentence-transformers) between our progress lines; back to Python's default.
logging.getLogger().setLevel(logging.WARNING)

# "extended" fuses attention, layer norm and GELU and stays portable across x86-64 CPUs;
# "all" adds layout changes tied to the build host's CPU, so it is not the default.
LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# Protobuf caps a model file at 2 GB; past this size weights go to a .data file beside the graph.
EXTERNAL_DATA_BYTES = 1_500_000_000


def is_large(path: Path) -> bool:
    """Past protobuf's comfort: a big file, or weights already kept outside it (torch.onnx does that)."""
    if path.stat().st_size > EXTERNAL_DATA_BYTES:
        return True
    graph = onnx.load(str(path), load_external_data=False)
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer)


def optimize(source: Path, engine_file: Path, level: str = "extended") -> Path:
    if level not in LEVELS:
        raise InputError(f"graph_optimization {level!r} is not one of {sorted(LEVELS)}")
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.optimized_model_filepath = str(engine_file)
    if is_large(source):
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         engine_file.name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    engine_file.parent.mkdir(parents=True, exist_ok=True)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return engine_file


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """ONNX Runtime's quantizers log advice through the root logger; the user sees our progress instead."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def down_projections(model_path: Path) -> list[str]:
    """MatMuls whose constant weight maps a wider space to a narrower one (the FFN's second layer)."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul" and len(shape := shapes.get(
        node.input[1], ())) == 2 and shape[0] > shape[1]]


def quantize(source: Path, target: Path, profile: Profile, task: str) -> Path:
    """Write the quantized graph to target; fp32 profiles leave the source as it is."""
    options = ort_options(profile.engine_options)
    if profile.precision == "fp32":
        return source
    if task in ENCODER_TASKS and profile.precision == "int8":
        # Only the linear layers' MatMuls, which hold the compute; the embedding table's Gather gains no speed
        # from int8. The FFN down-projections stay fp32: their inputs (after GELU) carry the outliers that
        # per-tensor activation scales clip. MiniLM: min cosine 0.979 -> 0.986, at 0.64x the int8 speed.
        with _quiet_logs():
            quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=options.per_channel,
                             reduce_range=options.reduce_range, op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=down_projections(source))
        return target
    raise InputError(f"precision {profile.precision} is not available on ONNX Runtime CPU for {task} models")
