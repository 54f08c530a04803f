"""ONNX Runtime's fused norms for what the modeling code traced into primitives: an RMSNorm (Pow, ReduceMean,
Add, Sqrt, Reciprocal, Mul, Mul) becomes SimplifiedLayerNormalization, and with the residual Add before it
SkipSimplifiedLayerNormalization, the nodes the fast lane writes. The matching is onnxscript's own ORT fusion
rules (the ones torch.onnx's optimizer ships for ONNX Runtime); its rotary and attention fusions are not applied:
attention is the engine's already, and its rotary rule leaves a node ONNX Runtime cannot run where the cos/sin
cache rule does not also match (it expects position ids as an input; the generic graph computes them)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnxscript.rewriter.ort_fusions._core import _pre_optimize
from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization


def fused_norms(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The traced graph with its RMSNorms fused; a graph with none comes back as it was."""
    model = _pre_optimize(ir.serde.deserialize_model(proto))
    if not fuse_rms_normalization(model):
        return proto
    fuse_skip_rms_normalization(model)
    return ir.serde.serialize_model(model)
