"""mbuild's int8 kernel (runtimes/kernels/int8_tiles.cpp) compiled here and run inside ONNX Runtime, against
ONNX Runtime's own MatMulNBits on the same 8-bit blocks: both quantize activations the same way, so they agree to
float rounding at every row count the engine sends (a decode row, verify rows of 2-5, batches, prefill chunks).
Needs g++ and, once, deb.debian.org (the C API headers); a CPU without AVX-512 VNNI is refused, not crashed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from transformers import LlamaConfig

from builder.engine import int8_tiles, weight_writer
from builder.engine.export_decoder import export_decoder
from builder.engine.native_kernels import build_library
from builder.engine.weight_writer import pack_rows
from builder.planning.profiles import load_profiles
from runtimes.bundle.engine import Batching
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.sessions import open_session
from runtimes.hardware import read_cpu_flags
from runtimes.kernels import ATTENTION_OP, DOMAIN, LIBRARY_FILE, NO_AMX_ENTRY
from tests.support.tiny_models import save_random_decoder

VNNI = {"avx512f", "avx512bw", "avx512_vnni"} <= read_cpu_flags()
AMX = VNNI and {"amx_tile", "amx_int8"} <= read_cpu_flags()


def _session(k: int, n: int, weights: np.ndarray, library: str | None, threads: int,
             amx: bool = True) -> ort.InferenceSession:
    packed, scales = pack_rows(weights, 8, 128)
    if library:
        tiles, tile_scales = int8_tiles.tile_weights(packed, scales)
        inits = [numpy_helper.from_array(tiles, "w"), numpy_helper.from_array(tile_scales, "s")]
        node = helper.make_node(int8_tiles.OP, ["x", "w", "s"], ["y"], **int8_tiles.attributes(k, n))
    else:
        inits = [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales.reshape(-1), "s")]
        node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=8,
                                block_size=128, accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", "k"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not amx:
        options.add_session_config_entry(NO_AMX_ENTRY, "1")
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_library(tmp_path_factory.mktemp("kernels")))


@pytest.mark.skipif(not VNNI, reason="this CPU has no AVX-512 VNNI: the kernel refuses it (test below)")
@pytest.mark.parametrize(("k", "n"), [(640, 1280), (1728, 640), (200, 100), (128, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_gives_matmulnbits_numbers_at_every_row_count(library: str, k: int, n: int, threads: int) -> None:
    rng = np.random.default_rng(k * n + threads)
    weights = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    ours, theirs = (_session(k, n, weights, lib, threads) for lib in (library, None))
    for rows in (1, 2, 3, 4, 5, 6, 8, 11, 16, 17, 64):  # 8 and more: the tiles, where the core has AMX
        x = rng.standard_normal((1, rows, k), dtype=np.float32)
        x[0, 0, :3] = [40.0, -40.0, 0.0]  # an outlier, as real activations have: the block's scale follows it
        got, want = ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0]
        assert got.shape == (1, rows, n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        exact = x @ weights.T  # and both near the float product: the quantization error, nothing more
        assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX: every row runs on VNNI")
@pytest.mark.parametrize(("k", "n"), [(640, 1280), (200, 100)])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_on_the_tiles_give_vnnis_bits(library: str, k: int, n: int, threads: int) -> None:
    """Eight rows or more go to AMX's tiles on a core that has them; the same int32 dots summed in the same order
    give the same floats as the VNNI path, which the session entry NO_AMX_ENTRY (MBUILD_NO_AMX) keeps a session on."""
    rng = np.random.default_rng(k + n + threads)
    weights = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    sessions = {amx: _session(k, n, weights, library, threads, amx) for amx in (True, False)}
    for rows in (1, 7, 8, 15, 16, 17, 33, 64):
        x = rng.standard_normal((2, rows, k), dtype=np.float32)
        x[0, 0, :2] = [40.0, -40.0]
        tiles, vnni = (sessions[amx].run(None, {"x": x})[0] for amx in (True, False))
        assert tiles.shape == (2, rows, n)
        np.testing.assert_array_equal(tiles, vnni)


@pytest.mark.skipif(not VNNI, reason="this CPU has no AVX-512 VNNI")
def test_a_misfit_input_is_an_error_from_the_session_not_a_crash(library: str) -> None:
    session = _session(256, 64, np.ones((64, 256), np.float32), library, 1)
    with pytest.raises(Exception, match="last dimension is not K"):
        session.run(None, {"x": np.ones((1, 2, 255), np.float32)})
    assert session.run(None, {"x": np.ones((1, 0, 256), np.float32)})[0].shape == (1, 0, 64)


@pytest.mark.skipif(VNNI, reason="this CPU has AVX-512 VNNI: the refusal needs one without")
def test_a_cpu_without_vnni_is_refused_with_what_to_do(library: str) -> None:
    with pytest.raises(Exception, match="needs a CPU with AVX-512"):
        _session(128, 64, np.ones((64, 128), np.float32), library, 1)


@pytest.mark.skipif(not VNNI, reason="this CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("block_rows", [None, 24])
def test_a_tiles_engine_decodes_as_its_matmulnbits_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         block_rows: int | None) -> None:
    """The whole path: a decoder exported with quantization tiles (its layers' weights laid out for the kernel,
    the library beside the graph) and loaded as the runtime loads it, against the same export on MatMulNBits.
    Blocks of 24 checkpoint rows make groups of 64 columns straddle them; a vocabulary of 1000 ends in a part
    group."""
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=320, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    model = save_random_decoder(config, tmp_path / "model")
    if block_rows:
        monkeypatch.setattr(weight_writer, "BLOCK_BYTES", block_rows * 4 * config.hidden_size)
    logits = {}
    for quantization in ("tiles", "blocks"):
        profile = next(p for p in load_profiles() if p.hardware == "cpu.vnni" and p.precision == "int8"
                       and "text-generation" in p.tasks)
        options = {**profile.engine_options, "quantization": quantization}
        out = tmp_path / quantization
        exported = export_decoder(model, out, profile.model_copy(update={"engine_options": options}))
        assert (out / LIBRARY_FILE).is_file() == (quantization == "tiles")
        ops = {node.op_type for node in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
        mine = quantization == "tiles"  # the library beside the graph runs its matrices and its attention
        assert ("MatMulInt8Tiles" in ops, ATTENTION_OP in ops) == (mine, mine)
        assert ("MatMulNBits" in ops, "GroupQueryAttention" in ops) == (not mine, not mine)
        engine = DecoderEngine(out, exported.engine_config("onnxruntime", "model.onnx", "int8", Batching(2, 0)),
                               threads=1)
        steps = [engine.run(0, np.array([[1, 17, 99, 3, 250, 42, 7]]))]
        for _ in range(5):  # decode rows, then a verify-like row of 3
            steps.append(engine.run(0, steps[-1].argmax(-1).reshape(1, -1)).copy())
        steps.append(engine.run(0, np.array([[5, 6, 7]])).copy())
        logits[quantization] = np.concatenate([s.reshape(-1, config.vocab_size) for s in steps])
    # Same blocks, same activation quantization: the engines agree to float rounding, except where that rounding
    # (the kernels sum in different orders) tips an activation over an int8 step, rarely, by one step's worth
    # (measured: 1 row in 7 here, 0.086 in a logit; every other row within 2e-6).
    diff = np.abs(logits["tiles"] - logits["blocks"]).max(axis=1)
    assert (diff < 1e-4).mean() >= 0.8 and diff.max() < 0.25, diff
    assert (logits["tiles"].argmax(1) == logits["blocks"].argmax(1)).all()


@pytest.mark.skipif(not VNNI, reason="this CPU has no AVX-512 VNNI")
def test_mbuild_no_amx_reaches_the_engines_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MBUILD_NO_AMX sets the option entry the library reads as it registers (the entry's effect: the test above);
    unset, the session carries no entry and the kernel may take the tiles."""
    config = LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = save_random_decoder(config, tmp_path / "model")
    profile = next(p for p in load_profiles() if p.hardware == "cpu.vnni" and p.precision == "int8"
                   and "text-generation" in p.tasks)
    exported = export_decoder(model, tmp_path / "out", profile)
    engine_config = exported.engine_config("onnxruntime", "model.onnx", "int8", Batching(1, 0))
    monkeypatch.setenv("MBUILD_NO_AMX", "1")
    session = open_session(tmp_path / "out", engine_config, 1)
    assert isinstance(session, ort.InferenceSession)
    assert session.get_session_options().get_session_config_entry(NO_AMX_ENTRY) == "1"
    monkeypatch.delenv("MBUILD_NO_AMX")
    session = open_session(tmp_path / "out", engine_config, 1)
    assert isinstance(session, ort.InferenceSession)
    with pytest.raises(RuntimeError, match="does not have configuration"):
        session.get_session_options().get_session_config_entry(NO_AMX_ENTRY)


def test_without_a_compiler_the_build_says_so_and_writes_matmulnbits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    config = LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = save_random_decoder(config, tmp_path / "model")
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path / "cache"))  # nothing built before
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    profile = next(p for p in load_profiles() if p.hardware == "cpu.vnni" and p.precision == "int8"
                   and "text-generation" in p.tasks)
    with caplog.at_level("WARNING", logger="mbuild"):
        export_decoder(model, tmp_path / "out", profile)
    assert "int8 kernel is unavailable" in caplog.text and "no-such-g++" in caplog.text
    assert not (tmp_path / "out" / LIBRARY_FILE).exists()
    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph
    ops = {node.op_type for node in graph.node}
    assert "MatMulNBits" in ops and "MatMulInt8Tiles" not in ops and ATTENTION_OP not in ops
