"""int8 embeddings quantize the linear layers to int8 and keep each FFN down-projection in fp32."""

from __future__ import annotations

from pathlib import Path

import onnx

from builder.engine.compile_ort import down_projections, quantize
from builder.planning.profiles import load_profiles


def test_int8_keeps_the_ffndown_projections_in_fp32(tiny_build: Path, tmp_path: Path) -> None:
    source = tiny_build / "work" / "model.onnx"  # the raw export, as the compile stage reads it
    profile = next(p for p in load_profiles() if p.engine == "onnxruntime" and p.hardware == "cpu"
                   and p.precision == "int8" and "embedding" in p.tasks)
    down = set(down_projections(source))
    assert len(down) == 2 and all("output/dense" in name for name in down)  # one per layer of the tiny BERT
    graph = onnx.load(str(quantize(source, tmp_path / "int8.onnx", profile, "embedding"))).graph
    assert down <= {n.name for n in graph.node if n.op_type == "MatMul"}  # still fp32
    # Q, K, V, attention output and FFN up-projection of both layers are int8; the embedding table is not
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 2 * 5
    assert not any(n.op_type == "DequantizeLinear" and "embeddings" in n.name for n in graph.node)
