"""mbuild's attention kernel (runtimes/kernels/attention.cpp) compiled here and run inside ONNX Runtime, against ONNX
Runtime's own GroupQueryAttention on the same inputs: the new keys and values it writes into the cache (fp32, or int8
at static per-channel scales) and its output, for what the engine sends (decode rows at different lengths, verify rows,
prompt chunks side by side, a chunk on top of a cache), packed or apart q|k|v, full, partial and no rotary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from transformers import LlamaConfig

from bench.lib.step_profile import group_query_attention_twin
from builder.engine.export_decoder import export_decoder
from builder.engine.kv_cache_quant import quantize_graph
from builder.engine.native_kernels import build_library
from builder.planning.profiles import load_profiles
from runtimes.bundle.engine import Batching
from runtimes.engines.decoder import DecoderEngine
from runtimes.hardware import read_cpu_flags
from runtimes.kernels import ATTENTION_INT8_OP, ATTENTION_OP, DOMAIN
from tests.support.tiny_models import save_random_decoder

VNNI = {"avx512f", "avx512bw", "avx512_vnni"} <= read_cpu_flags()
pytestmark = pytest.mark.skipif(not VNNI, reason="the library registers on AVX-512 VNNI CPUs only")


def _session(library: str, ours: bool, heads: int, kv: int, dim: int, buffer: int, half: int, packed: bool,
             int8: bool) -> ort.InferenceSession:
    cache = TensorProto.INT8 if int8 else TensorProto.FLOAT
    width = (heads + 2 * kv) * dim if packed else heads * dim
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", "S", width])]
    names = ["q", "", ""]
    if not packed:
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", kv * dim]) for n in ("k", "v")]
        names = ["q", "k", "v"]
    inputs += [helper.make_tensor_value_info(n, cache, ["B", kv, buffer, dim]) for n in ("pk", "pv")]
    inputs += [helper.make_tensor_value_info("sk", TensorProto.INT32, ["B"]),
               helper.make_tensor_value_info("total", TensorProto.INT32, None)]
    names += ["pk", "pv", "sk", "total", *(("cos", "sin") if half else ("", ""))]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [buffer, half]) for n in ("cos", "sin") if half]
    attributes: dict[str, Any] = {"num_heads": heads, "kv_num_heads": kv, "do_rotary": int(bool(half)), "scale": 0.0}
    if int8:
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [kv, 1, dim]) for n in ("ks", "vs")]
        if not ours:  # GroupQueryAttention's scales come after position_ids, attention_bias and head_sink
            names += ["", "", ""]
            attributes.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        names += ["ks", "vs"]
    op, domain = ((ATTENTION_INT8_OP if int8 else ATTENTION_OP), DOMAIN) if ours else ("GroupQueryAttention",
                                                                                       "com.microsoft")
    node = helper.make_node(op, names, ["out", "pk_out", "pv_out"], domain=domain, **attributes)
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
               *(helper.make_tensor_value_info(n, cache, None) for n in ("pk_out", "pv_out"))]
    model = helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], cache: np.ndarray,
         shared: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """out, keys, values: the caches bound in place as the engine binds them, or given back fresh."""
    keys, values = cache.copy(), cache[:, :, ::-1].copy()
    binding = session.io_binding()
    binding.bind_output("out")
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for name, buffer in (("pk", keys), ("pv", values)):
        binding.bind_input(name, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data)
        if shared:
            binding.bind_output(f"{name}_out", "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data)
        else:
            binding.bind_output(f"{name}_out")
    session.run_with_iobinding(binding)
    got = binding.copy_outputs_to_cpu()
    return (got[0], keys, values) if shared else (got[0], got[1], got[2])


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_library(tmp_path_factory.mktemp("kernels")))


CASES = [  # heads, kv heads, head size, rotary half-width, batch, new tokens, past per row, shared buffer
    (10, 5, 64, 32, 1, 1, [96], True),  # a decode row (the bench model's shape)
    (10, 5, 64, 32, 1, 5, [96], True),  # a verify row
    (10, 5, 64, 16, 1, 4, [33], True),  # partial rotary
    (8, 8, 32, 0, 3, 1, [5, 0, 130], True),  # decode rows at different lengths, no rotary
    (12, 4, 128, 64, 1, 70, [100], True),  # a prompt chunk on top of a cache
    (10, 5, 64, 32, 3, 17, [0, 0, 0], True),  # first chunks of three prompts side by side
    (4, 2, 16, 8, 2, 1, [40, 7], True),  # the tiny test models' head size
    (10, 5, 64, 32, 1, 4, [20], False),  # present handed back as a new buffer
]


@pytest.mark.parametrize(("heads", "kv", "dim", "half", "batch", "new", "past", "shared"), CASES)
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("int8", [False, True])
def test_the_kernel_gives_group_query_attention_numbers(library: str, heads: int, kv: int, dim: int, half: int,
                                                       batch: int, new: int, past: list[int], shared: bool,
                                                       packed: bool, int8: bool) -> None:
    rng = np.random.default_rng(heads * dim + new + batch)
    buffer = 256
    width = (heads + 2 * kv) * dim if packed else heads * dim
    lengths = np.array(past) + new
    feeds = {"q": rng.standard_normal((batch, new, width), np.float32) * 0.5,
             "sk": (lengths - 1).astype(np.int32), "total": np.array(lengths.max(), np.int32)}
    if not packed:
        feeds["k"], feeds["v"] = (rng.standard_normal((batch, new, kv * dim), np.float32) for _ in range(2))
    if half:
        angles = rng.random((buffer, half), np.float32) * 6
        feeds["cos"], feeds["sin"] = np.cos(angles), np.sin(angles)
    if int8:
        feeds["ks"], feeds["vs"] = (rng.random((kv, 1, dim), np.float32) * 0.03 + 0.01 for _ in range(2))
    cache: np.ndarray = (rng.integers(-40, 41, (batch, kv, buffer, dim)).astype(np.int8) if int8
                         else rng.standard_normal((batch, kv, buffer, dim), np.float32))
    ours = _run(_session(library, True, heads, kv, dim, buffer, half, packed, int8), feeds, cache, shared)
    theirs = _run(_session(library, False, heads, kv, dim, buffer, half, packed, int8), feeds, cache, shared)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-5 * np.abs(theirs[0]).max())
    for mine, want in zip(ours[1:], theirs[1:], strict=True):
        for row, length in enumerate(lengths):  # past a row's length the cache holds nothing meaningful
            np.testing.assert_allclose(mine[row, :, :length].astype(np.float32),
                                       want[row, :, :length].astype(np.float32), atol=1e-6)
    for row, held in enumerate(past):  # the past left as it was
        assert (ours[1][row, :, :held] == cache[row, :, :held]).all()


def test_a_misfit_input_is_an_error_from_the_session_not_a_crash(library: str) -> None:
    session = _session(library, True, 4, 2, 16, 32, 8, True, False)
    cache = np.zeros((1, 2, 32, 16), np.float32)
    angles = np.zeros((32, 8), np.float32)
    feeds = {"q": np.zeros((1, 2, 8 * 16), np.float32), "cos": angles, "sin": angles}
    for lengths, message in (([0], "shorter than its new tokens"), ([40], "past the cache")):
        with pytest.raises(Exception, match=message):
            _run(session, {**feeds, "sk": np.array(lengths, np.int32), "total": np.array(2, np.int32)}, cache, True)
    with pytest.raises(Exception, match="one number"):
        _run(session, {**feeds, "sk": np.array([1], np.int32), "total": np.zeros(0, np.int32)}, cache, True)
    with pytest.raises(Exception, match="multiple of kv_num_heads"):
        _session(library, True, 3, 2, 16, 32, 8, True, False)


@pytest.mark.parametrize("int8_cache", [False, True])
def test_an_engine_on_the_kernel_decodes_as_its_group_query_attention_twin(tmp_path: Path, int8_cache: bool) -> None:
    """The whole path: an int8 export on the kernel library (its attention is mbuild's), loaded as the runtime
    loads it, against the same folder with GroupQueryAttention put back (bench/lib/step_profile.py's twin, the
    before of its profiles): a prompt, decode rows and a verify-like row, the fp32 cache or an int8 one."""
    config = LlamaConfig(vocab_size=500, hidden_size=256, intermediate_size=320, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    model = save_random_decoder(config, tmp_path / "model")
    profile = next(p for p in load_profiles() if p.hardware == "cpu.vnni" and p.precision == "int8"
                   and "text-generation" in p.tasks)
    out = tmp_path / "ours"
    exported = export_decoder(model, out, profile)
    if int8_cache:
        scale = np.full((2, 1, 64), 0.05, np.float32)
        quantize_graph(out / "model.onnx", [scale] * 4)
    ops = {node.op_type for node in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert (ATTENTION_INT8_OP if int8_cache else ATTENTION_OP) in ops and "GroupQueryAttention" not in ops
    twin = group_query_attention_twin(out, tmp_path / "twin")
    twin_ops = {node.op_type for node in onnx.load(str(twin / "model.onnx"), load_external_data=False).graph.node}
    assert "GroupQueryAttention" in twin_ops and not twin_ops & {ATTENTION_OP, ATTENTION_INT8_OP}
    logits = []
    for folder in (out, twin):
        engine = DecoderEngine(folder, exported.engine_config("onnxruntime", "model.onnx", "int8", Batching(2, 0)),
                               threads=1)
        assert engine.kv_dtype == (np.int8 if int8_cache else np.float32)
        steps = [engine.run(0, np.array([[1, 17, 99, 3, 250, 42, 7]]))]
        for _ in range(8):
            steps.append(engine.run(0, steps[-1].argmax(-1).reshape(1, -1)).copy())
            steps.append(engine.run(0, np.array([[5, 6, 7, 8, 9]])).copy())
        logits.append(np.concatenate([s.reshape(-1, config.vocab_size) for s in steps]))
    # The attention outputs agree to float rounding (the test above); the int8 matrices after them quantize their
    # input per block, where that rounding now and then tips a value over an int8 step: then a row moves by that
    # step's worth (as test_int8_tiles measures between its two matrix kernels); an int8 cache rounds keys and
    # values too, so there a tipped value stays in the cache (measured: 6 of 17 rows by 0.06-0.09, the rest 2e-5).
    diff = np.abs(logits[0] - logits[1]).max(axis=1)
    assert (diff < 1e-3 * np.abs(logits[1]).max()).mean() >= 0.5 and diff.max() < 0.25, diff
    if not int8_cache:  # random weights' near-tied logits let a kept 0.09 pick another token; fp32 keeps none
        assert (logits[0].argmax(1) == logits[1].argmax(1)).all()
