"""Issue 59: pre-quantized checkpoints read by their quantization_config (builder/engine/dequant/ through
checkpoint.py): each format, written byte for byte from its spec (tests/support/quantized_checkpoints.py), reads
back as the values its codes stand for, whole or a band of rows at a time; transformers' own dequantizing load
agrees where it has one (FP8); the plan counts the download as stored and refuses a method mbuild does not read."""

from __future__ import annotations

import functools
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto, helper
from safetensors.numpy import load_file
from safetensors.torch import save_file as save_torch

from builder.cli import cli
from builder.engine.checkpoint import Checkpoint
from builder.engine.weight_writer import DATA_FILE, INPUT_ORDER, LinearFormat, LinearWriter, WeightFile
from builder.errors import UnsupportedModel
from builder.model.quantization import source_format
from builder.model.shape import facts_from_config
from tests.support import quantized_checkpoints as qc
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.family_configs import family_configs
from tests.support.tiny_models import save_random_decoder

FORMATS: dict[str, tuple[dict[str, Any], Any]] = {
    "gptq-v1-act-order": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True},
                          functools.partial(qc.gptq, bits=4, group=32, act_order=True, v2=False)),
    "gptq-v2-8bit": ({"quant_method": "gptq", "bits": 8, "group_size": 32, "checkpoint_format": "gptq_v2",
                      "sym": False}, functools.partial(qc.gptq, bits=8, group=32, act_order=False, v2=True)),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True},
            functools.partial(qc.awq, group=32)),
    "fp8-blocks": ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32],
                    "activation_scheme": "dynamic"}, functools.partial(qc.fp8_blocks, block=32)),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_decoder(family_configs()["qwen3"], tmp_path_factory.mktemp("qwen3") / "fp32")


@pytest.fixture(scope="module", params=sorted(FORMATS))
def written(request: pytest.FixtureRequest, source: Path) -> tuple[str, Path, Path]:
    quantization, quantize = FORMATS[request.param]
    out = qc.write(source, source.parent / request.param, quantization, quantize)
    return request.param, out, out.with_name(out.name + "-dequantized")


def test_each_format_reads_back_as_its_values(written: tuple[str, Path, Path]) -> None:
    _, folder, twin = written
    expected = load_file(str(twin / "model.safetensors"))
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        names = set(checkpoint.names())
        assert names == set(expected), names ^ set(expected)  # the module's names, no packed parts among them
        decoded = [name for name in names if name in checkpoint.decoded]
        assert len(decoded) == 2 * 7  # q, k, v, o, gate, up and down in both layers
        for name in names:
            assert np.array_equal(checkpoint.get(name), expected[name]), name
        name = "model.layers.1.mlp.down_proj.weight"  # a band of rows that splits a word and a block
        assert np.array_equal(checkpoint.rows(name, 5, 27), expected[name][5:27])


@pytest.mark.parametrize("kind", ["fp8-blocks", "mxfp4"])
def test_it_reads_as_transformers_dequantizes_it(kind: str, tmp_path: Path, source: Path) -> None:
    """transformers loads FP8 and MXFP4 checkpoints on a CPU only dequantized: its weights are ours (FP8's through
    bf16, so to bf16's precision)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config  # type: ignore[attr-defined]

    if kind == "mxfp4":
        source = save_random_decoder(family_configs()["gpt_oss"], tmp_path / "gpt-oss")
        folder = qc.write(source, tmp_path / kind, {"quant_method": "mxfp4"}, qc.mxfp4, qc.experts)
        extra: dict[str, Any] = {"quantization_config": Mxfp4Config(dequantize=True)}
    else:
        folder = qc.write(source, tmp_path / kind, *FORMATS[kind])
        extra = {}
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **extra).state_dict()
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        assert len(checkpoint.decoded) == (4 if kind == "mxfp4" else 14)
        for name in checkpoint.decoded:
            ours, expected = checkpoint.get(name), theirs[name].float().numpy()
            assert np.array_equal(ours, expected) if kind == "mxfp4" else np.allclose(ours, expected, rtol=1e-2), name


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")  # run_compressed=False is the point
@pytest.mark.parametrize(("fmt", "bits", "symmetric", "group"), [
    ("pack-quantized", 4, True, 32), ("pack-quantized", 4, False, 32), ("pack-quantized", 8, True, 0),
    ("int-quantized", 8, True, 0), ("float-quantized", 8, True, 0), ("float-quantized", 8, True, -1)])
def test_compressed_tensors_read_as_the_library_decompresses_them(fmt: str, bits: int, symmetric: bool, group: int,
                                                                  tmp_path: Path, source: Path) -> None:
    """Written by compressed-tensors itself; transformers with the library decompresses them (run_compressed off)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    folder = qc.compressed(source, tmp_path / fmt, fmt, bits, symmetric, group)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(run_compressed=False))
    expected = theirs.state_dict()
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        assert len(checkpoint.decoded) == 14 and checkpoint.format.startswith(f"compressed-tensors {fmt}")
        for name in checkpoint.decoded:
            assert np.array_equal(checkpoint.get(name), expected[name].numpy()), name


@pytest.mark.parametrize("kind", ["stacked experts", "e8m0 scales"])
def test_fp8_stacked_experts_and_power_of_two_scales_read_back(kind: str, tmp_path: Path) -> None:
    """FP8 experts in one [E, N, K] tensor with a block scale each ([E, sN, sK]), read an expert a row; scales stored
    as E8M0 exponents (UE8M0), 2^(byte - 127)."""
    name = "gpt_oss" if kind == "stacked experts" else "qwen3"
    source = save_random_decoder(family_configs()[name], tmp_path / name)
    quantize = functools.partial(qc.fp8_blocks, block=16, e8m0=kind == "e8m0 scales")
    folder = qc.write(source, tmp_path / "fp8", {"quant_method": "fp8", "weight_block_size": [16, 16]}, quantize,
                      qc.linear_and_experts)
    expected = load_file(str(folder.with_name(folder.name + "-dequantized") / "model.safetensors"))
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        stacked = [n for n in checkpoint.decoded if len(checkpoint.shape(n)) == 3]
        assert (len(stacked) == 4) == (kind == "stacked experts") and checkpoint.decoded
        for name in checkpoint.decoded:
            assert np.array_equal(checkpoint.get(name), expected[name]), name
            assert np.array_equal(checkpoint.rows(name, 1, 3), expected[name][1:3]), name


def test_the_plan_counts_the_download_as_stored(written: tuple[str, Path, Path]) -> None:
    kind, folder, twin = written
    quantized = facts_from_config(json.loads((folder / "config.json").read_text()), "text-generation")
    plain = facts_from_config(json.loads((twin / "config.json").read_text()), "text-generation")
    assert quantized.params == plain.params and quantized.checkpoint_gb and plain.checkpoint_gb
    assert quantized.checkpoint_gb < plain.checkpoint_gb / (2 if kind != "gptq-v2-8bit" else 1.5)


@pytest.mark.parametrize("method", ["bitsandbytes", "hqq", "exl2", "gguf", ""])
def test_a_method_mbuild_does_not_read_is_refused_by_name(method: str) -> None:
    config = {**family_configs()["qwen3"].to_dict(), "quantization_config": {"quant_method": method}}
    with pytest.raises(UnsupportedModel) as refused:
        facts_from_config(config, "text-generation")
    assert (repr(method) if method else "no quant_method") in refused.value.message
    assert "gptq" in (refused.value.hint or "")


@pytest.mark.parametrize(("quantization", "why"), [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ at 3 bits"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ gemv"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24"}, "'marlin-24' format"),
])
def test_a_variant_mbuild_does_not_read_is_refused(quantization: dict[str, Any], why: str) -> None:
    with pytest.raises(UnsupportedModel, match=why):
        source_format({"quantization_config": quantization})


@pytest.mark.parametrize("command", ["plan", "package"])
@pytest.mark.parametrize("method", ["bitsandbytes", "hqq", "exl2"])
def test_an_unread_method_on_the_hub_is_refused_before_its_weights_download(
        fake_hub: FakeHub, tmp_path: Path, command: str, method: str) -> None:
    """Through the real huggingface_hub client: only config.json is fetched, then exit 7 naming the method."""
    folder = save_random_decoder(family_configs()["qwen3"], tmp_path / "repo")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": method}}))
    fake_hub.repos["org/quantized"] = FakeRepo(folder, sha="3" * 40)
    out = tmp_path / "out"
    extra = ["--backend", "none", "--output", str(out)] if command == "package" else []
    result = CliRunner().invoke(cli, [command, "org/quantized", "--gpu", "cpu", *extra])
    assert result.exit_code == UnsupportedModel.exit_code, result.output
    assert f"quantized with {method!r}, which mbuild does not read" in result.output
    assert "Traceback" not in result.output and not out.exists()
    downloads = [r for r in fake_hub.requests if "/resolve/" in r]
    assert downloads and all(r.endswith("/config.json") for r in downloads), downloads


def _dequantized_by_matmulnbits(folder: Path, name: str, form: LinearFormat, out: Path) -> tuple[np.ndarray, str]:
    """The weight as LinearWriter writes it for `form`, read back through ONNX Runtime's own MatMulNBits kernel
    (fp32 compute, x = the identity): W [N, K] as the engine holds it, and whether the op got zero points."""
    k = Checkpoint(folder, ExitStack()).shape(name)[1]
    out.mkdir()
    with ExitStack() as stack, open(out / DATA_FILE, "wb") as data:
        weights = WeightFile(data.fileno())
        op, inputs, attributes = LinearWriter(weights, Checkpoint(folder, stack), form)([name], "w")
    order = attributes.pop(INPUT_ORDER, None)  # as decoder_graph.linear does: the input gathered first
    nodes = [helper.make_node("Gather", ["x", order], ["x_ordered"], axis=-1)] if order else []
    nodes.append(helper.make_node(op, ["x_ordered" if order else "x", *inputs], ["y"], domain="com.microsoft",
                                  **attributes))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "w", [x], [y], weights.initializers),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    onnx.save(model, str(out / "model.onnx"))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": np.eye(k, dtype=np.float32)})[0]).T, ",".join(inputs)


@pytest.mark.parametrize("kind", ["gptq-sym", "gptq-act-order", "awq", "compressed"])
def test_an_int4_build_keeps_a_grid_its_blocks_hold(kind: str, tmp_path: Path) -> None:
    """Groups of 128 are int4 blocks of 128: GPTQ (symmetric or not), AWQ and compressed-tensors' codes, zero
    points and scales are written as they are, so the engine's weights are the checkpoint's values exactly; an
    act-order GPTQ's columns are written sorted by group, and the input is gathered in that order."""
    config = family_configs()["qwen3"]
    config.hidden_size, config.intermediate_size = 128, 256
    source = save_random_decoder(config, tmp_path / "fp32")
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}
    if kind == "compressed":
        folder = qc.compressed(source, tmp_path / kind, "pack-quantized", 4, False, 128)
    elif kind == "awq":
        folder = qc.write(source, tmp_path / kind, {"quant_method": "awq", "bits": 4, "group_size": 128,
                                                    "version": "gemm"}, functools.partial(qc.awq, group=128))
    else:
        act_order = kind == "gptq-act-order"
        folder = qc.write(source, tmp_path / kind, {**gptq, "desc_act": act_order},
                          functools.partial(qc.gptq, bits=4, group=128, act_order=act_order, v2=False))
    twin = load_file(str(folder.with_name(folder.name + "-dequantized") / "model.safetensors"))
    form = LinearFormat("nbits", bits=4, block_size=128)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):  # K 128, 256
        held, inputs = _dequantized_by_matmulnbits(folder, name, form, tmp_path / name)
        assert "zero_points" in inputs and np.array_equal(held, twin[name]), np.abs(held - twin[name]).max()


def test_a_grid_whose_groups_are_not_blocks_is_rounded_again(tmp_path: Path) -> None:
    """GPTQ in groups of 32 built into int4 blocks of 128: rounded by ONNX Runtime's symmetric blocks (a step of
    absmax/8, the positive end clipped at 7 steps), close to the checkpoint's values but not them."""
    config = family_configs()["qwen3"]
    config.hidden_size, config.intermediate_size = 128, 256
    source = save_random_decoder(config, tmp_path / "fp32")
    folder = qc.write(source, tmp_path / "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True},
                      functools.partial(qc.gptq, bits=4, group=32, act_order=False, v2=False))
    twin = load_file(str(folder.with_name(folder.name + "-dequantized") / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    form = LinearFormat("nbits", bits=4, block_size=128)
    held, inputs = _dequantized_by_matmulnbits(folder, name, form, tmp_path / "w")
    assert "zero_points" not in inputs and not np.array_equal(held, twin[name])
    assert np.abs(held - twin[name]).max() <= np.abs(twin[name]).max() / 8


@pytest.mark.parametrize(("damage", "says"), [
    ("group_size", "columns in groups of 16 \\(config.json.s group_size\\) make"),
    ("scales", "implies"),
    ("qweight", "packed weights are int32 matrices"),
])
def test_a_gptq_checkpoint_that_disagrees_with_its_config_is_refused_by_name(damage: str, says: str, source: Path,
                                                                             tmp_path: Path) -> None:
    """Not a wrong decode, nor an mbuild bug: a config.json whose group size the tensors do not have, a scale of the
    wrong shape, a packed tensor that is not int32 words."""
    quantization, quantize = FORMATS["gptq-v2-8bit"]
    folder = qc.write(source, tmp_path / "gptq", quantization, quantize, twin=False)
    config = json.loads((folder / "config.json").read_text())
    tensors = {k: torch.from_numpy(v) for k, v in load_file(str(folder / "model.safetensors")).items()}
    stem = "model.layers.0.self_attn.q_proj"
    if damage == "group_size":
        config["quantization_config"]["group_size"] = 16
        tensors = {k: v for k, v in tensors.items() if not k.endswith(".g_idx")}
    elif damage == "scales":
        tensors[f"{stem}.scales"] = tensors[f"{stem}.scales"][:1].contiguous()
    else:
        tensors[f"{stem}.qweight"] = tensors[f"{stem}.qweight"].float()
    (folder / "config.json").write_text(json.dumps(config))
    save_torch(tensors, str(folder / "model.safetensors"))
    with ExitStack() as stack, pytest.raises(UnsupportedModel, match=says):
        Checkpoint(folder, stack)


def test_a_gptq_checkpoint_in_pytorch_model_bin_reads_back(source: Path, tmp_path: Path) -> None:
    """Older GPTQ uploads hold their int32 words in pytorch_model.bin, read through torch as the format's only
    reader."""
    quantization, quantize = FORMATS["gptq-v1-act-order"]
    folder = qc.write(source, tmp_path / "gptq", quantization, quantize)
    stored = folder / "model.safetensors"
    torch.save({k: torch.from_numpy(v) for k, v in load_file(str(stored)).items()}, folder / "pytorch_model.bin")
    stored.unlink()
    expected = load_file(str(folder.with_name(folder.name + "-dequantized") / "model.safetensors"))
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        assert len(checkpoint.decoded) == 14
        for name in checkpoint.decoded:
            assert np.array_equal(checkpoint.get(name), expected[name]), name
