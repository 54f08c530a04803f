"""Bytes of weights one decode step reads, from the files each server loads.

At one stream a decode step reads every weight matrix once (of a mixture of experts, the experts its token is
routed to), so these bytes over the time per output token are the rate a server streams its weights; one core's
read rate (bench/lib/harness.py's read_rate_gbs) bounds that rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from bench.lib import llamacpp
from bench.lib.llm_models import gguf_module
from runtimes.kernels import ATTENTION_INT8_OP, ATTENTION_OP, EXPERTS_OP

# Read a row a step (the embedding table, plain or quantized; the rotary tables) or the cached positions only
NOT_STREAMED = {"Gather", "GatherBlockQuantized", "GroupQueryAttention", ATTENTION_OP, ATTENTION_INT8_OP}
EXPERTS = {"MoE", "QMoE", EXPERTS_OP}  # a step reads the experts its tokens are routed to


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


def onnx_step_bytes(model: Path, experts_read: float = 1.0) -> int:
    """Initializers an mbuild engine graph reads whole each step: its weights, scales and norms; of a mixture of
    experts' weights (the experts nodes' initializers, [E, ...] each) the share `experts_read` of them."""
    graph = onnx.load(str(model), load_external_data=False).graph
    streamed = {name for node in graph.node if node.op_type not in NOT_STREAMED for name in node.input}
    experts = {name for node in graph.node if node.op_type in EXPERTS for name in node.input}
    return round(sum(_tensor_bytes(t) * (experts_read if t.name in experts else 1.0)
                     for t in graph.initializer if t.name in streamed))


def gguf_step_bytes(gguf: Path, experts_read: float = 1.0) -> int:
    """A GGUF's tensors a llama.cpp decode step reads whole: all but the token embeddings, which are read whole
    only when the output projection is tied to them; of the experts' tensors (*_exps) the share `experts_read`."""
    tensors = {t.name: int(t.n_bytes) for t in gguf_module(llamacpp.SPM_VOCAB).GGUFReader(gguf).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return round(sum(size * (experts_read if "_exps." in name else 1.0) for name, size in tensors.items()))


def experts_read(config: dict[str, Any], tokens: int) -> float:
    """The expected share of a layer's experts that `tokens` tokens in one step route to, each to k of E experts
    drawn alike (as a random model's router draws them): 1 - (1 - k/E)^tokens; 1.0 for a dense model."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    if not experts:
        return 1.0
    return float(1 - (1 - config["num_experts_per_tok"] / experts) ** tokens)


def step_bytes(builds: dict[str, Path | str], ggufs: dict[str, Path], experts_read: float = 1.0) -> dict[str, int]:
    """The bytes a step reads, by arm ("mbuild int8", "llama.cpp q8_0"), of each mbuild bundle that built (a
    failed one is its reason, a str) and each GGUF."""
    return {**{f"mbuild {p}": onnx_step_bytes(b / "model" / "model.onnx", experts_read)
               for p, b in builds.items() if isinstance(b, Path)},
            **{f"llama.cpp {kind}": gguf_step_bytes(path, experts_read) for kind, path in ggufs.items()}}
