"""Complex-valued ops the exporter's library (onnxscript's torchlib, 0.7) lacks, registered into it on import.

Rotary embeddings built as complex numbers (torch.polar and view_as_complex: DeepSeek-V2's, Llama 4's) trace into
complex tensors, which torchlib carries as real ones with a trailing dimension of 2 and translates op by op; an op
without a complex translation stops the export. Each below is the real op with that trailing dimension kept."""

from __future__ import annotations

from functools import cache
from typing import Any

from onnxscript.function_libs.torch_lib.registration import torch_op
from onnxscript.onnx_opset import opset18 as op


def unsqueeze_complex(self: Any, dim: int) -> Any:
    axis = dim - 1 if dim < 0 else dim  # a dimension from the end skips the (re, im) one
    return op.Unsqueeze(self, [axis])  # type: ignore[arg-type]  # traced: a list is a constant, as in torchlib


@cache
def register() -> None:
    """Into torchlib's default registry, which each export reads (once a process)."""
    torch_op("aten::unsqueeze", complex=True, trace_only=True)(unsqueeze_complex)
