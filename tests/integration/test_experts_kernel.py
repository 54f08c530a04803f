"""mbuild's experts kernel (runtimes/kernels/experts.cpp, ExpertsInt8Tiles) compiled here and run inside ONNX
Runtime, on the block decoder_moe.moe_block writes for Mixtral, Qwen3-MoE and gpt-oss (biases, clamped SwiGLU) from
the same tiny random checkpoints as transformers' own modules. Checked: the numbers against the original module and
against the module holding the weights the engine stores (as test_decoder_moe.py checks QMoE); a token's output
the same bits however many tokens share its step (1, a decode batch, prefill chunks past the tiles' 10 rows), on
one thread or two, on AMX's tiles or VNNI; and a misfit input is the session's error, not a crash. Needs g++ and,
once, deb.debian.org (the C API headers), as test_int8_tiles.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from builder.engine import int8_tiles
from builder.engine.native_kernels import build_library
from builder.engine.weight_writer import LinearFormat
from runtimes.hardware import read_cpu_flags
from runtimes.kernels import DOMAIN, EXPERTS_OP, NO_AMX_ENTRY
from tests.support.moe_blocks import (
    KINDS,
    build_block,
    config_of,
    initializers,
    load_experts,
    module_of,
    reference,
    relative_error,
    sample_x,
    session,
)
from tests.support.tiny_models import save_random_decoder

VNNI = {"avx512f", "avx512bw", "avx512_vnni"} <= read_cpu_flags()
AMX = VNNI and {"amx_tile", "amx_int8"} <= read_cpu_flags()
TILES = LinearFormat("nbits", bits=8, block_size=int8_tiles.BLOCK, tiles=True)
# relative L2 errors allowed: about twice the 8-bit blocks' measured in test_decoder_moe.py (activations in int8 too)
ORIGINAL, OWN_WEIGHTS = 0.035, 0.03
pytestmark = pytest.mark.skipif(not VNNI, reason="this CPU has no AVX-512 VNNI: the library refuses it "
                                                 "(test_int8_tiles.py checks the refusal)")


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_library(tmp_path_factory.mktemp("kernels")))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: save_random_decoder(config_of(kind), tmp_path_factory.mktemp(kind)) for kind in KINDS}


def _stored(model: Path, name: str, n: int, k: int) -> np.ndarray:
    """A projection's experts [E, N, K] as the engine stores them in the tiles' layout, dequantized here."""
    found = initializers(model)
    tiles, scales = found[f"{name}.weight_tiles"], found[f"{name}.weight_tile_scales"]
    experts, groups, blocks = tiles.shape[:3]
    codes = tiles.transpose(0, 1, 4, 2, 3, 5).reshape(experts, groups * int8_tiles.GROUP, blocks * int8_tiles.BLOCK)
    per_column = scales.transpose(0, 1, 3, 2).reshape(experts, groups * int8_tiles.GROUP, blocks)
    values = (codes.astype(np.float32) - 128).reshape(experts, -1, blocks, int8_tiles.BLOCK) * per_column[..., None]
    return values.reshape(experts, groups * int8_tiles.GROUP, -1)[:, :n, :k]


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_runs_each_familys_experts(kind: str, library: str, folders: dict[str, Path],
                                              tmp_path: Path) -> None:
    config = config_of(kind)
    model = build_block(folders[kind], config, 0, TILES, tmp_path)
    ops = {n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    assert EXPERTS_OP in ops and "QMoE" not in ops
    x = sample_x(config.hidden_size)
    y = np.asarray(session(model, library).run(None, {"x": x})[0])
    module = module_of(folders[kind], 0)
    assert 0 < relative_error(y, reference(module, x)) < ORIGINAL
    hidden, inter = int(config.hidden_size), int(getattr(config, "moe_intermediate_size", config.intermediate_size))
    load_experts(module, kind, _stored(model, "layers.0.moe.fc1", 2 * inter, hidden),
                 _stored(model, "layers.0.moe.fc2", hidden, inter))
    assert relative_error(y, reference(module, x)) < OWN_WEIGHTS


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_a_tokens_output_does_not_depend_on_its_step(kind: str, library: str, folders: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """Each expert's rows are summed alike for 1 row or 40, and the experts in one order: the same bits."""
    config = config_of(kind)
    model = build_block(folders[kind], config, 0, TILES, tmp_path)
    entries = [{}, {NO_AMX_ENTRY: "1"}] if AMX else [{}]
    sessions = [session(model, library, threads, e) for threads in (1, 2) for e in entries]
    x = sample_x(config.hidden_size, tokens=40, seed=3)
    x[0, 0, :2] = [30.0, -30.0]  # an outlier: its block's scale follows it
    alone = np.concatenate([sessions[0].run(None, {"x": x[:, t:t + 1]})[0] for t in range(40)], axis=1)
    for each in sessions:
        for tokens in (1, 5, 16, 40):
            np.testing.assert_array_equal(each.run(None, {"x": x[:, :tokens]})[0], alone[:, :tokens])


def test_a_misfit_input_is_an_error_from_the_session_not_a_crash(library: str, tmp_path: Path) -> None:
    hidden, inter, experts = 64, 32, 4
    fc1 = np.full((experts, 1, 1, 32, 64, 4), 128, np.uint8)  # 2I = 64 columns: one group, one block
    fc2 = np.full((experts, 1, 1, 32, 64, 4), 128, np.uint8)
    scales = np.ones((experts, 1, 1, 64), np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((fc1, "w1"), (scales, "s1"), (fc2, "w2"), (scales, "s2"))]
    node = helper.make_node(EXPERTS_OP, ["x", "logits", "w1", "s1", "", "w2", "s2", ""], ["y"], domain=DOMAIN, k=2,
                            inter=inter, normalize_routing_weights=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "h"]),
                                            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["t", "e"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", "h"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    onnx.save(model, str(tmp_path / "model.onnx"))
    run = session(tmp_path / "model.onnx", library)
    x, logits = np.ones((3, hidden), np.float32), np.zeros((3, experts), np.float32)
    assert run.run(None, {"x": x, "logits": logits})[0].shape == (3, hidden)
    logits[1, 2] = np.nan  # a NaN logit is never chosen, and poisons nothing
    assert np.isfinite(run.run(None, {"x": x, "logits": logits})[0]).all()
    for bad, words in (({"x": np.ones((3, 200), np.float32)}, "do not fit"),
                       ({"logits": np.zeros((2, experts), np.float32)}, "router logits"),
                       ({"logits": np.zeros((3, 1), np.float32)}, "router logits")):
        with pytest.raises(Exception, match=words):
            run.run(None, {"x": x, "logits": logits, **bad})
    assert run.run(None, {"x": x[:0], "logits": logits[:0]})[0].shape == (0, hidden)
