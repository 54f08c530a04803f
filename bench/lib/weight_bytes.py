"""Bytes of weights one decode step reads, from the files each server loads.

At one stream a decode step reads every weight matrix once, so these bytes over the time per output token are
the rate a server streams its weights; one core's read rate (bench.harness.read_rate_gbs) bounds that rate.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from bench.lib import llamacpp
from bench.lib.llm_models import gguf_module

# Read a row a step (the embedding table, plain or quantized; the rotary tables) or the cached positions only
NOT_STREAMED = {"Gather", "GatherBlockQuantized", "GroupQueryAttention"}


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    external = {entry.key: entry.value for entry in tensor.external_data}
    if "length" in external:
        return int(external["length"])
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def onnx_step_bytes(model: Path) -> int:
    """Initializers an mbuild engine graph reads whole each step: its weights, scales and norms."""
    graph = onnx.load(str(model), load_external_data=False).graph
    streamed = {name for node in graph.node if node.op_type not in NOT_STREAMED for name in node.input}
    return sum(_tensor_bytes(t) for t in graph.initializer if t.name in streamed)


def gguf_step_bytes(gguf: Path) -> int:
    """A GGUF's tensors a llama.cpp decode step reads whole: all but the token embeddings, which are read whole
    only when the output projection is tied to them."""
    tensors = {t.name: int(t.n_bytes) for t in gguf_module(llamacpp.SPM_VOCAB).GGUFReader(gguf).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())
