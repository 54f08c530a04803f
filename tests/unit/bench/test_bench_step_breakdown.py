"""The step_breakdown benchmark (bench/scenarios/step_breakdown.py): a matmul's FLOPs read from the graph's weights,
a step's parts that add up to the served step, and both views of a real built engine's step on the tiny Llama."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from bench.lib.llm_models import LLAMA_TINY
from bench.lib.step_parts import LM_HEAD, matmul_flops, parts, rates
from bench.scenarios import step_breakdown
from builder.engine import int8_tiles


def _weights(name: str, shape: tuple[int, ...], dtype: type = np.uint8) -> TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype), name)


def test_matmul_flops_are_read_from_each_kernels_weights(tmp_path: Path) -> None:
    nodes = [helper.make_node("MatMul", ["x", "router"], ["r"], name="layers.0.router"),
             helper.make_node(int8_tiles.OP, ["x", "t", "s"], ["q"], name="layers.0.qkv",
                              **int8_tiles.attributes(64, 192)),
             helper.make_node("QMoE", ["x", "r", "fc1", "fc1s", "", "fc2", "fc2s", ""], ["m"], name="layers.0.moe",
                              domain="com.microsoft", k=2, expert_weight_bits=8),
             helper.make_node("MatMul", ["q", "m"], ["a"], name="scores"),  # two activations: no weights
             helper.make_node("MatMulNBits", ["a", "h", "hs"], ["logits"], name="lm_head", domain="com.microsoft",
                              K=64, N=512, bits=8, block_size=32)]
    weights = [_weights("router", (64, 8), np.float32), _weights("fc1", (8, 128, 64)), _weights("fc2", (8, 64, 64))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 512])], weights)
    save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    found = matmul_flops(tmp_path / "model.onnx")
    assert {key: (entry["precision"], entry["nodes"], entry["flops"]) for key, entry in found.items()} == {
        "MatMul": ("fp32", 2, 2 * 64 * 8), int8_tiles.OP: ("int8", 1, 2 * 64 * 192),
        "QMoE": ("int8", 1, 2 * 2 * (128 * 64 + 64 * 64)), LM_HEAD: ("int8", 1, 2 * 64 * 512)}
    assert found[LM_HEAD]["op"] == "MatMulNBits"
    profile = {"step_ms": 2.0, "ops_ms": {LM_HEAD: 0.5, int8_tiles.OP: 1.0}}
    reached = rates(found, profile, 16, {"int8": 1.0})
    assert set(reached) == {LM_HEAD, int8_tiles.OP}  # the ops the profile timed
    assert reached[LM_HEAD]["gflops"] == pytest.approx(16 * 2 * 64 * 512 / 0.5e-3 / 1e9)
    assert reached[LM_HEAD]["peak_share"] == pytest.approx(reached[LM_HEAD]["gflops"])


def test_the_parts_add_up_to_the_served_step_in_the_profiles_shares() -> None:
    served = {"step": 10.0, "scheduling": 0.5, "engine step": 8.0, "ONNX Runtime": 7.0, "apply": 1.2, "sampling": 0.7}
    profile = {"step_ms": 14.0, "ops_ms": {"Add": 1.0, LM_HEAD: 2.0, "CausalAttention": 2.0, int8_tiles.OP: 6.0,
                                           "SimplifiedLayerNormalization": 1.0, "QMoE": 0.0}}
    found = parts(served, profile)
    assert list(found)[:4] == [f"matmuls: {int8_tiles.OP}", "matmuls: QMoE", LM_HEAD, "attention"]
    assert found[f"matmuls: {int8_tiles.OP}"] == pytest.approx(3.0)  # 6 of the profile's 14 ms, of the served 7
    assert found["other ONNX Runtime ops"] == pytest.approx(1.0)
    assert found["ONNX Runtime between its kernels"] == pytest.approx(1.0)
    assert found["Python around the session call"] == pytest.approx(1.0)
    assert found["apply, less sampling"] == pytest.approx(0.5)
    assert found["the loop's rest"] == pytest.approx(0.3)
    assert sum(found.values()) == pytest.approx(served["step"])


def test_the_options_name_known_shapes() -> None:
    assert step_breakdown.parse_options(["--shapes", "1b,moe", "--steps", "4"]) == {"shapes": ["1b", "moe"],
                                                                                    "steps": 4}
    assert step_breakdown.parse_options([]) == {"shapes": None, "steps": None}
    with pytest.raises(SystemExit):
        step_breakdown.parse_options(["--shapes", "2b"])


def test_a_built_engines_step_in_both_views(tiny_llm_build: Path) -> None:
    """The tiny Llama's int8 build (the unit suite's, made once): the profiler's and the engine loop's steps at 1
    and 2 rows, joined, and the page's tables of them."""
    found = step_breakdown.measure(tiny_llm_build, 2, {"int8": 1000.0, "fp32": 100.0}, batches=(1, 2))
    for batch in ("1", "2"):
        served, step = found["served"][batch], found["parts"][batch]
        assert served["step"] > served["engine step"] > served["ONNX Runtime"] > 0
        assert served["apply"] > served["sampling"] > 0 and served["scheduling"] > 0
        assert sum(step.values()) == pytest.approx(served["step"])
        assert any(name.startswith("matmuls: ") for name in step) and LM_HEAD in step and "attention" in step
        assert LM_HEAD in found["matmuls"][batch] and found["matmuls"][batch][LM_HEAD]["peak_share"] > 0
    case = {**found, "title": "tiny", "precision": "int8", "shape": LLAMA_TINY, "vocab": 512, "gate": None,
            "default_precision": "int8"}
    text = step_breakdown.markdown({"onnxruntime": "x", "steps": 2, "warm": 3, "cases": {"tiny": case},
                                    "peaks": {"int8": {"gflops": 1000.0, "kernel": "k"}}}, "python -m bench x")
    assert "| **step** (one engine-loop tick) |" in text and f"| {LM_HEAD} (" in text
    assert text.count("| c=1 ms | c=1 share | c=2 ms | c=2 share |") == 1
    assert "| tiny | int8 | " in text  # the summary's row
