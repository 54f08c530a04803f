"""Graphs of weight matrices on one ONNX Runtime kernel each, and a kernel's best rate at many rows.

The kernels by arm name (bench/scenarios/matmul_rows.py lists them): mbuild's MatMulInt8Tiles ("int8 mbuild tiles
b128", kept on VNNI by "... VNNI"), ONNX Runtime's MatMulNBits ("int8 MatMulNBits b128", "int4 MatMulNBits b128"),
its DynamicQuantizeMatMul ("int8 dynamic") and its fp32 MatMul ("fp32 ONNX Runtime"); random values, each matrix an
initializer, as an engine's weights are.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.lib.harness import PEAK_SHAPES, best_gflops
from builder.engine import int8_tiles
from builder.engine.native_kernels import build_library
from runtimes.kernels import DOMAIN, NO_AMX_ENTRY


def kernel_session(shapes: list[tuple[int, int]], arm: str, rng: np.random.Generator) -> ort.InferenceSession:
    """One graph of a weight matrix [K, N] per shape, random values, on `arm`'s kernel (an arm of matmul_rows' ARMS
    that runs in ONNX Runtime), each fed by the input x{K} [rows, K]; one intra-op thread."""
    nodes, weights, outputs = [], [], []
    for i, (k, n) in enumerate(shapes):
        if arm.startswith("fp32"):
            weights.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.02, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"]))
        elif arm == "int8 dynamic":
            weights += [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), f"w{i}"),
                        numpy_helper.from_array(rng.random(n, dtype=np.float32) * 0.01, f"s{i}")]
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [f"x{k}", f"w{i}", f"s{i}"], [f"y{i}"],
                                          domain="com.microsoft"))
        elif "tiles" in arm:
            blocks = -(-k // int8_tiles.BLOCK)
            tiles, scales = int8_tiles.tile_weights(rng.integers(0, 256, (n, blocks, int8_tiles.BLOCK), dtype=np.uint8),
                                                    rng.random(n * blocks, dtype=np.float32) * 0.01)
            weights += [numpy_helper.from_array(tiles, f"w{i}"), numpy_helper.from_array(scales, f"s{i}")]
            nodes.append(helper.make_node(int8_tiles.OP, [f"x{k}", f"w{i}", f"s{i}"], [f"y{i}"],
                                          **int8_tiles.attributes(k, n)))
        else:
            bits, block = (8 if arm.startswith("int8") else 4), 128
            blocks = -(-k // block)
            weights += [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8),
                                                f"w{i}"),
                        numpy_helper.from_array(rng.random(n * blocks, dtype=np.float32) * 0.01, f"s{i}")]
            nodes.append(helper.make_node("MatMulNBits", [f"x{k}", f"w{i}", f"s{i}"], [f"y{i}"],
                                          domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                                          accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["rows", n]))
    widths = sorted({k for k, _ in shapes})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["rows", k]) for k in widths]
    model = helper.make_model(helper.make_graph(nodes, "step", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                                             helper.make_opsetid(DOMAIN, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    if "tiles" not in arm:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    if arm.endswith("VNNI"):
        options.add_session_config_entry(NO_AMX_ENTRY, "1")
    options.register_custom_ops_library(str(build_library()))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def kernel_peak_gflops(arm: str, shapes: tuple[tuple[int, int, int], ...] = PEAK_SHAPES[2:], reps: int = 4) -> float:
    """The best rate of `arm`'s kernel over matmuls [M, K] x [K, N] (one matrix a graph; by default Llama-3.2-1B's MLP
    projections both ways at 512 rows, where ONNX Runtime's fp32 MatMul peaks), 3 timings each, one thread on the
    calling thread's cores: that kernel's ceiling on this core, which a step's rows are measured against."""
    rng = np.random.default_rng(0)
    best = 0.0
    for m, k, n in shapes:
        session = kernel_session([(k, n)], arm, rng)
        feeds = {f"x{k}": rng.standard_normal((m, k), dtype=np.float32)}
        best = max(best, best_gflops(partial(session.run, None, feeds), 2 * m * k * n, reps))
    return best
