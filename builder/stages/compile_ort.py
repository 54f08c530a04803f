"""CPU compile: quantization where the profile asks for it, then ONNX Runtime's graph optimizer.

Both run once at build time and the result is saved as the engine.
  embeddings, int8:       dynamic quantization (int8 weights per channel, activations at run time)
  language models, int8/int4: weight-only block quantization (MatMulNBits), as onnxruntime-genai does
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from builder.errors import InputError
from builder.profiles import Profile

# "extended" fuses attention, layer norm and GELU and stays portable across x86-64 CPUs;
# "all" adds layout changes tied to the build host's CPU, so it is not the default.
LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_NBITS = {"int8": 8, "int4": 4}
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


def quantize(source: Path, target: Path, profile: Profile, task: str) -> Path:
    """Write the quantized graph to target; fp32 profiles leave the source as it is."""
    options = profile.engine_options
    if profile.precision == "fp32":
        return source
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    if task == "embedding" and profile.precision == "int8":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=bool(options.get("per_channel")),
                         reduce_range=bool(options.get("reduce_range")))
        return target
    if task == "text-generation" and profile.precision in _NBITS:
        level = options.get("accuracy_level")
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=_NBITS[profile.precision],
                                         block_size=int(options.get("block_size", 32)), is_symmetric=True,
                                         accuracy_level=int(level) if level is not None else None)
        quantizer.process()
        quantizer.model.save_model_to_file(str(target), use_external_data_format=is_large(source))
        return target
    raise InputError(f"precision {profile.precision} is not available on ONNX Runtime CPU for {task} models")
