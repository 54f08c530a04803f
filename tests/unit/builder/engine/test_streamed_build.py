"""A language model's build never holds the model: the export reads a sharded bf16 checkpoint a block of rows at a
time and writes the engine in its precision as it goes; the gate's reference runs one layer at a time. Each is
checked against what it replaces: the torch.onnx export's logits, ONNX Runtime's own quantizers' weights, and
transformers' whole-model forward pass. A host that cannot build is refused up front, with the number.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import tracemalloc
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
from safetensors.numpy import save_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from builder.engine import decoder_graph, weight_writer
from builder.engine.checkpoint import INDEX, Checkpoint
from builder.engine.decoder_graph import write_decoder
from builder.engine.export_decoder import export_decoder_tensorrt
from builder.engine.reference import reference_logits
from builder.engine.weight_writer import LinearFormat
from builder.errors import InputError, UnsupportedModel
from runtimes.bundle import Batching
from runtimes.engines.decoder import DecoderEngine
from runtimes.hardware import read_ram_gb
from tests.support.family_configs import WINDOW, family_configs
from tests.support.procs import mbuild
from tests.support.tiny_models import save_random_decoder

pytestmark = pytest.mark.slow
SHAPE: dict[str, Any] = {"vocab_size": 1000, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 8,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                         "initializer_range": 0.1, "bos_token_id": 1, "eos_token_id": 2}
PROMPTS = [[1, 17, 99, 3, 250, 42, 7, 600], [1, 5, 900], [1, 200, 201, 202, 9, 9, 9, 9, 9, 30, 31, 32, 33, 34, 35]]


@pytest.fixture(scope="module")
def sharded_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_random_decoder(LlamaConfig(**SHAPE), tmp_path_factory.mktemp("sharded-bf16"), torch.bfloat16,
                                 "300KB")
    assert (folder / INDEX).is_file() and len(list(folder.glob("model-*.safetensors"))) > 3
    return folder


@pytest.fixture(params=["whole tensors", "blocks of 8 rows"])
def block_bytes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model's tensors each fit one 64 MB block; small blocks take the path an 8B model's take."""
    if request.param != "whole tensors":
        for module in (weight_writer, decoder_graph):
            monkeypatch.setattr(module, "BLOCK_BYTES", 8 * 4 * SHAPE["hidden_size"])


def _logits(engine: DecoderEngine) -> np.ndarray:
    """Each prompt prefilled in its own row, then four decode steps of all rows together."""
    steps = [np.concatenate([engine.run(row, np.array([p])) for row, p in enumerate(PROMPTS)])]
    for _ in range(4):
        steps.append(engine.run(0, steps[-1].argmax(-1).reshape(-1, 1)).copy())
    return np.stack(steps)


def _weight_bytes(folder: Path) -> int:
    return sum(4 * int(np.prod(shape)) for shape in _shapes(folder).values())


def _shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="np") as handle:
            shapes.update({n: tuple(handle.get_slice(n).get_shape()) for n in handle.keys()})  # noqa: SIM118
    return shapes


@pytest.mark.usefixtures("block_bytes")
def test_sharded_bf16_export_equals_the_torch_export_in_a_fraction_of_the_model(sharded_bf16: Path,
                                                                               tmp_path: Path) -> None:
    config = AutoConfig.from_pretrained(sharded_bf16)
    tracemalloc.start()
    dims = write_decoder(sharded_bf16, config, tmp_path / "streamed")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The bound: a few copies of the largest tensor (read, widened, transposed), never the model.
    largest = max(4 * int(np.prod(s)) for s in _shapes(sharded_bf16).values())
    bound = 4 * largest + (1 << 20)
    total = _weight_bytes(sharded_bf16)
    print(f"export peak {peak / 2**20:.2f} MiB (bound {bound / 2**20:.2f}); fp32 weights {total / 2**20:.2f} MiB")
    assert bound * 2 < total, "the model must dwarf the bound, or the bound proves nothing"
    assert peak < bound

    previous = export_decoder_tensorrt(sharded_bf16, tmp_path / "torch")
    torch_config = previous.engine_config("onnxruntime", "model.onnx", "fp32", Batching(4, 0))
    streamed_config = dataclasses.replace(torch_config, inputs=(
        "input_ids", "seqlens_k", "total_sequence_length", "logits_at",
        *[f"past_{k}.{i}" for i in range(dims.layers) for k in ("key", "value")]))
    streamed = _logits(DecoderEngine(tmp_path / "streamed", streamed_config, threads=1))
    torch_export = _logits(DecoderEngine(tmp_path / "torch", torch_config, threads=1))
    diff = float(np.abs(streamed - torch_export).max())
    print(f"max abs logit difference, streamed vs torch.onnx export: {diff:.2e}")
    assert diff < 1e-4
    assert (streamed.argmax(-1) == torch_export.argmax(-1)).all()


def _initializers(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: onnx.numpy_helper.to_array(t, str(path.parent)) for t in model.graph.initializer}


@pytest.mark.parametrize(("reduce_range", "per_channel"), [(False, True), (True, True), (False, False)])
@pytest.mark.usefixtures("block_bytes")
def test_int8_weights_are_onnxruntime_quantize_dynamic_s(sharded_bf16: Path, tmp_path: Path,
                                                         reduce_range: bool, per_channel: bool) -> None:
    config = AutoConfig.from_pretrained(sharded_bf16)
    write_decoder(sharded_bf16, config, tmp_path / "fp32")
    quantize_dynamic(tmp_path / "fp32" / "model.onnx", tmp_path / "library.onnx", weight_type=QuantType.QInt8,
                     per_channel=per_channel, reduce_range=reduce_range, op_types_to_quantize=["MatMul"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    write_decoder(sharded_bf16, config, tmp_path / "int8", LinearFormat("int8", per_channel=per_channel,
                                                                            reduce_range=reduce_range))
    ours, library = _initializers(tmp_path / "int8" / "model.onnx"), _initializers(tmp_path / "library.onnx")
    quantized = [n for n in ours if n.endswith(("_quantized", "_scale"))]
    assert len(quantized) == 2 * (4 * config.num_hidden_layers + 1)  # qkv, o, gate|up, down per layer; lm head
    for name in quantized:
        np.testing.assert_array_equal(ours[name], library[name], err_msg=name)


@pytest.mark.parametrize("bits", [4, 8])  # int4 profiles; int8 profiles on VNNI CPUs
@pytest.mark.usefixtures("block_bytes")
def test_block_weights_are_onnxruntime_matmulnbits_quantizer_s(sharded_bf16: Path, tmp_path: Path,
                                                               bits: int) -> None:
    config = AutoConfig.from_pretrained(sharded_bf16)
    write_decoder(sharded_bf16, config, tmp_path / "fp32")
    quantizer = MatMulNBitsQuantizer(onnx.load(str(tmp_path / "fp32" / "model.onnx")), bits=bits, block_size=64,
                                     is_symmetric=True, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(tmp_path / "library.onnx"), use_external_data_format=True)
    write_decoder(sharded_bf16, config, tmp_path / "blocks", LinearFormat("nbits", bits=bits, block_size=64,
                                                                          accuracy_level=4))
    ours, library = _initializers(tmp_path / "blocks" / "model.onnx"), _initializers(tmp_path / "library.onnx")
    packed = [n for n in ours if n.endswith(f"_q{bits}")]
    assert len(packed) == 4 * config.num_hidden_layers + 1
    for name in packed:
        np.testing.assert_array_equal(ours[name], library[name.replace(f"_q{bits}", f"_Q{bits}")], err_msg=name)
        scales = name.replace(f"_q{bits}", "_scales")
        np.testing.assert_array_equal(ours[scales], library[scales], err_msg=scales)


@pytest.mark.parametrize("family", sorted(family_configs()))
def test_the_layer_by_layer_reference_is_transformers_forward(family: str, tmp_path: Path) -> None:
    """Every family of the matrix, on a sequence that crosses its window twice (and a short one); MoE checkpoints
    hold their experts one by one, as transformers saves Mixtral's and Qwen3-MoE's, and are fused as it loads."""
    folder = save_random_decoder(family_configs()[family], tmp_path / family, shard="100KB")
    sequences = [[1, 5, 9, 200, 7, 7, 33, 250, 12, 13, 14, 90, 91, 3, 4, 60, 61, 62, 17, 18], [1, 42, 43]]
    assert len(sequences[0]) > 2 * WINDOW
    ours = reference_logits(folder, sequences, [2, 1])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for sequence, first, logits in zip(sequences, [2, 1], ours, strict=True):
        with torch.inference_mode():
            whole = model(torch.tensor([sequence])).logits[0, first - 1:-1].numpy()
        assert logits.shape == whole.shape
        assert float(np.abs(logits - whole).max()) < 1e-4


def test_a_host_that_cannot_build_is_refused_before_the_download(tmp_path: Path) -> None:
    """Llama-3.1-8B's config: its CPU int4 build fits this host; its TensorRT build (whole-model torch.onnx
    export) needs ~90 GB of RAM, and is refused with that number before anything is read."""
    folder = tmp_path / "llama-8b"
    folder.mkdir()
    config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, architectures=["LlamaForCausalLM"])
    config.save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"never read: the build stops before")
    needs = {}
    for gpu in ("cpu", "h100"):
        listed = mbuild("profiles", str(folder), "--gpu", gpu, "--json")
        assert listed.returncode == 0, listed.stderr
        chosen = json.loads(listed.stdout)
        needs[gpu] = next(p["build_gb"] for p in chosen["profiles"] if p["name"] == chosen["selected"])
    assert needs["cpu"] < 10 < 60 < needs["h100"]
    if read_ram_gb(key="MemAvailable") * 1.07 > needs["h100"]:
        pytest.skip("this host has the RAM to build it")
    result = mbuild("package", str(folder), "--backend", "none", "--gpu", "h100", "--output", str(tmp_path / "out"))
    assert result.returncode == InputError.exit_code, result.stderr
    assert f"needs about {needs['h100']:.1f} GB of RAM; this host has" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out" / "model").exists()


@pytest.mark.parametrize(("header", "why"), [
    (b"\xff" * 8, "header length is out of range"),
    (None, "is not JSON"),
    ([1, 2], "not a JSON object"),
    ({"w": {"dtype": "F32", "shape": [4]}}, "malformed"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 999]}}, "outside the file or has the wrong size"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 0]}}, "outside the file or has the wrong size"),
])
def test_a_damaged_safetensors_file_is_refused_by_name(tmp_path: Path, header: Any, why: str) -> None:
    if isinstance(header, bytes):
        raw = header
    else:
        text = b"{not json" if header is None else json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + b"\0" * 16
    (tmp_path / "model.safetensors").write_bytes(raw)
    with ExitStack() as stack, pytest.raises(UnsupportedModel, match=why):
        Checkpoint(tmp_path, stack)


@pytest.mark.parametrize("index", ["{not json", "[]", '{"weight_map": 5}'])
def test_a_damaged_index_is_refused_by_name(tmp_path: Path, index: str) -> None:
    (tmp_path / INDEX).write_text(index)
    with ExitStack() as stack, pytest.raises(UnsupportedModel, match="is not a readable index"):
        Checkpoint(tmp_path, stack)


def test_a_tensor_of_another_type_is_refused_only_when_read(tmp_path: Path) -> None:
    save_file({"w": np.ones((2, 3), np.float32), "steps": np.arange(3, dtype=np.int64)},
              str(tmp_path / "model.safetensors"))
    with ExitStack() as stack:
        checkpoint = Checkpoint(tmp_path, stack)
        assert checkpoint.get("w").tolist() == [[1.0] * 3] * 2
        with pytest.raises(UnsupportedModel, match="is I64, and its config names no quantization"):
            checkpoint.get("steps")
