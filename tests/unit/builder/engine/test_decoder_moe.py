"""decoder_moe.moe_block against transformers' own MoE modules (Mixtral, Qwen3-MoE, gpt-oss), loaded with the same
tiny random checkpoint: one block in a graph, run by ONNX Runtime's CPU MoE / QMoE kernels on 2 x 5 tokens.

fp32 matches to 1e-4 (outputs reach ~40). A quantized block is checked twice: against the module holding the
weights the engine stores, read back from the data file and dequantized here, which pins layout, packing,
scales and routing; and against the original module, within what its format costs on these weights
(initializer_range 0.3, H 64). Measured over the three families, relative L2 error against the original and
against the stored weights: 8-bit blocks (the int8 profile: blocks of 64 or 32 here) 1.6-1.9% and 1.2-1.6%,
since ONNX Runtime's CPU kernel quantizes their activations to int8 too; 4-bit blocks of 32 14-17% and 1e-7;
per-channel 8-bit (int8 where no block fits) 1.1-1.2% and 1e-7. The bounds are about twice that.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from builder.engine import mxfp4
from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_family import sparse_layer
from builder.engine.weight_writer import LinearFormat
from builder.errors import UnsupportedModel
from tests.support.moe_blocks import (
    KINDS,
    build_block,
    config_of,
    load_experts,
    module_of,
    reference,
    run_block,
    sample_x,
)
from tests.support.tiny_models import save_random_decoder

FORMS = {"int8": LinearFormat("int8"), "int4": LinearFormat("nbits", bits=4, block_size=32),
         "8bit-b32": LinearFormat("nbits", bits=8, block_size=32)}
# relative L2 errors allowed, about twice those measured (docstring)
OWN_WEIGHTS = {"int8": 0.03, "int4": 1e-5, "8bit-b32": 0.03, "int8-channel": 1e-5}
ORIGINAL = {"int8": 0.035, "int4": 0.3, "8bit-b32": 0.035, "int8-channel": 0.025}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: save_random_decoder(config_of(kind), tmp_path_factory.mktemp(kind)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_matches_transformers(kind: str, folders: dict[str, Path], tmp_path: Path) -> None:
    config = config_of(kind)
    x = sample_x(config.hidden_size)
    for layer in [i for i in range(config.num_hidden_layers) if sparse_layer(config, i)]:
        y = run_block(build_block(folders[kind], config, layer, LinearFormat(), tmp_path / str(layer)), x)
        assert np.abs(y - reference(module_of(folders[kind], layer), x)).max() < 1e-4


def test_qwen3_moe_without_renormalised_weights(folders: dict[str, Path], tmp_path: Path) -> None:
    config = config_of("qwen3_moe", norm_topk_prob=False)
    x = sample_x(config.hidden_size)
    y = run_block(build_block(folders["qwen3_moe"], config, 0, LinearFormat(), tmp_path), x)
    expected = reference(module_of(folders["qwen3_moe"], 0, norm_topk_prob=False), x)
    assert np.abs(y - expected).max() < 1e-4
    assert np.abs(y - reference(module_of(folders["qwen3_moe"], 0), x)).max() > 1e-2  # the flag is seen


def _stored(model: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """fc1 / fc2 [E, N, K] as the engine stores them, dequantized here (symmetric: zero point 2^(bits-1))."""
    found = {t.name: t for t in onnx.load(str(model), load_external_data=False).graph.initializer}
    weight = next(n for n in found if n.startswith(f"{name}.weight_q"))
    bits = int(weight.rsplit("q", 1)[1])
    codes = numpy_helper.to_array(found[weight], base_dir=str(model.parent))
    scales = numpy_helper.to_array(found[f"{name}.scales"], base_dir=str(model.parent))
    if bits == 4:  # two codes a byte, the first in the low nibble
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(*codes.shape[:2], -1)
    values = codes.astype(np.float32) - 2 ** (bits - 1)
    if scales.ndim == 2:
        return values * scales[..., None], codes
    blocks = scales.shape[2]
    return (values.reshape(*values.shape[:2], blocks, -1) * scales[..., None]).reshape(values.shape), codes


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("kind", KINDS)
def test_quantized_experts(kind: str, form: str, folders: dict[str, Path], tmp_path: Path) -> None:
    config = config_of(kind)
    model = build_block(folders[kind], config, 0, FORMS[form], tmp_path)
    nodes = onnx.load(str(model), load_external_data=False).graph.node
    assert [n.op_type for n in nodes if n.domain == "com.microsoft"] == ["QMoE"]
    _check_quantized(kind, form, config, folders[kind], model)


def _check_quantized(kind: str, form: str, config: Any, folder: Path, model: Path) -> None:
    x = sample_x(config.hidden_size)
    y = run_block(model, x)
    module = module_of(folder, 0)
    exact = reference(module, x)
    error = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    assert 0 < error < ORIGINAL[form], error
    load_experts(module, kind, _stored(model, "layers.0.moe.fc1")[0], _stored(model, "layers.0.moe.fc2")[0])
    own = reference(module, x)
    assert np.linalg.norm(y - own) / np.linalg.norm(own) < OWN_WEIGHTS[form]


def test_router_stays_fp32(folders: dict[str, Path], tmp_path: Path) -> None:
    model = build_block(folders["gpt_oss"], config_of("gpt_oss"), 0, FORMS["int4"], tmp_path)
    ops = [n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node]
    assert ops == ["MatMul", "Add", "Reshape", "QMoE", "Identity"]


def _mxfp4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """weight [..., K] in MXFP4: (blocks [..., K/32, 16], scales [..., K/32], the values they encode)."""
    blocks = weight.reshape(*weight.shape[:-1], -1, 32)
    exponent = np.floor(np.log2(np.maximum(np.abs(blocks).max(-1, keepdims=True), 1e-30))) - 2  # 6 = 1.5 * 2^2
    scaled = blocks / 2.0 ** exponent
    index = np.abs(np.abs(scaled)[..., None] - mxfp4.E2M1).argmin(-1)  # nearest magnitude on the E2M1 grid
    codes = (index + 8 * (scaled < 0)).astype(np.uint8)
    values = np.where(scaled < 0, -1, 1) * mxfp4.E2M1[index] * 2.0 ** exponent
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent[..., 0] + mxfp4.BIAS).astype(np.uint8), values.reshape(weight.shape).astype(np.float32)


def test_mxfp4_widens_as_transformers_does() -> None:
    weight = np.random.default_rng(2).standard_normal((2, 6, 64)).astype(np.float32) * 0.1
    blocks, scales, values = _mxfp4(weight)
    ours = np.stack([mxfp4.widen(blocks[e], scales[e]) for e in range(2)])
    assert np.array_equal(ours, values)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    assert np.array_equal(ours, theirs.numpy().transpose(0, 2, 1))  # transformers' is [E, K, N], x @ W


def test_gpt_oss_mxfp4_checkpoint(folders: dict[str, Path], tmp_path: Path) -> None:
    """The Hub's layout: gate_up_proj_blocks [E, 2I, H/32, 16] and scales, down_proj likewise, rows out-major."""
    config = config_of("gpt_oss")
    tensors = load_file(str(folders["gpt_oss"] / "model.safetensors"))
    prefix = "model.layers.0.mlp.experts"
    encoded = {}
    for proj in ("gate_up_proj", "down_proj"):
        blocks, scales, encoded[proj] = _mxfp4(tensors.pop(f"{prefix}.{proj}").transpose(0, 2, 1))
        tensors[f"{prefix}.{proj}_blocks"], tensors[f"{prefix}.{proj}_scales"] = blocks, scales
    folder = tmp_path / "mxfp4"
    folder.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    x = sample_x(config.hidden_size)
    y = run_block(build_block(folder, config, 0, LinearFormat(), tmp_path / "engine"), x)
    module = module_of(folders["gpt_oss"], 0)
    load_experts(module, "gpt_oss", encoded["gate_up_proj"], encoded["down_proj"])
    assert np.abs(y - reference(module, x)).max() < 1e-4


@pytest.mark.parametrize(("kind", "layout"), [("mixtral", "split"), ("gpt_oss", "fused")])
@pytest.mark.parametrize("form", ["fp32", "int4"])
def test_experts_are_streamed(kind: str, layout: str, form: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """16 experts of 1 MB (fc1, fp32): the build's peak is a few experts' bytes (measured 2.0-3.2: the rows read,
    interleaved and packed), not the layer's 24, and each read of a stacked [E, ...] tensor is one expert."""
    config = config_of(kind, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_local_experts=16)
    if kind == "gpt_oss":
        config.layer_types = ["full_attention"]
    folder = save_random_decoder(config, tmp_path / "model")
    one_expert = 2 * 512 * 256 * 4
    reads: list[tuple[str, int]] = []
    rows = Checkpoint.rows

    def counted(self: Checkpoint, name: str, r0: int, r1: int) -> np.ndarray:
        reads.append((name, r1 - r0))
        return rows(self, name, r0, r1)

    monkeypatch.setattr(Checkpoint, "rows", counted)
    tracemalloc.start()
    try:
        build_block(folder, config, 0, LinearFormat() if form == "fp32" else FORMS["int4"], tmp_path / "engine")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * one_expert, peak / one_expert
    stacked = [n for n, count in reads if n.endswith(("gate_up_proj", "down_proj"))]
    assert all(count == 1 for n, count in reads if n in stacked) and (len(stacked) == 32) == (layout == "fused")


def test_bad_checkpoints_are_refused(folders: dict[str, Path], tmp_path: Path) -> None:
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("mixtral", {"intermediate_size": 96}, 0, "the config implies"),
        ("qwen3_moe", {}, 4, "lacks tensor"),
        ("gpt_oss", {"num_local_experts": 8}, 0, "the config implies"),
        ("qwen3_moe", {"hidden_act": "gelu"}, 0, "activation"),
        ("mixtral", {"num_experts_per_tok": 5}, 0, "routes each token")]
    for kind, changes, layer, words in cases:
        with pytest.raises(UnsupportedModel, match=words):
            build_block(folders[kind], config_of(kind, **changes), layer, LinearFormat(), tmp_path / kind)


def test_int8_without_a_block_is_per_channel(tmp_path: Path) -> None:
    """I = 24 is no multiple of a 16-wide block: int8 experts get a scale per row, 4-bit ones are refused."""
    config = config_of("qwen3_moe", moe_intermediate_size=24, num_hidden_layers=1)
    folder = save_random_decoder(config, tmp_path / "model")
    with pytest.raises(UnsupportedModel, match="block"):
        build_block(folder, config, 0, FORMS["int4"], tmp_path / "int4")
    model = build_block(folder, config, 0, FORMS["int8"], tmp_path / "int8")
    (node,) = [n for n in onnx.load(str(model), load_external_data=False).graph.node if n.op_type == "QMoE"]
    assert "block_size" not in {a.name for a in node.attribute}
    _check_quantized("qwen3_moe", "int8-channel", config, folder, model)
