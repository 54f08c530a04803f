"""A language model's CPU build, measured: a random ~0.5B Llama and a ~0.5B Qwen3-MoE (bf16, sharded like a Hub
checkpoint) packaged at int8 peak under the build memory `mbuild plan` predicts for them, and under their fp32
weights, which a build holding the model in fp32 (as the export and the gate did before: 2.1x) passes by far.
The scaled-down `python -m bench build_scale`: wide enough that the weights, not the build process (~0.6 GiB),
set the bound. The MoE's experts are streamed and quantized one at a time, as linear layers are."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, Qwen3MoeConfig

from bench.lib.rss import run_sampled
from builder.errors import ValidationFailed
from tests.support.procs import mbuild
from tests.support.tiny_models import save_random_decoder

# ~0.49B parameters: 1.8 GiB in fp32, 0.9 GiB of bf16 checkpoint
SHAPE: dict[str, Any] = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8,
                         "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048,
                         "bos_token_id": 1, "eos_token_id": 2, "architectures": ["LlamaForCausalLM"]}
# ~0.52B parameters, 0.1B active: Qwen3-30B-A3B's layer (128-wide heads, 32 query and 4 KV heads, experts of
# 768, 8 of them a token) at half its width and a quarter of its experts
MOE_SHAPE: dict[str, Any] = {**SHAPE, "hidden_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 32,
                             "num_key_value_heads": 4, "head_dim": 128, "num_experts": 32, "num_experts_per_tok": 8,
                             "moe_intermediate_size": 768, "norm_topk_prob": True,
                             "architectures": ["Qwen3MoeForCausalLM"]}
CONFIGS = {"llama": lambda: LlamaConfig(**SHAPE), "qwen3_moe": lambda: Qwen3MoeConfig(**MOE_SHAPE)}
GIB = 2**30


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def half_b(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_decoder(CONFIGS[request.param](), tmp_path_factory.mktemp(f"{request.param}-0.5b"),
                               torch.bfloat16, "300MB")


def test_an_int8_build_peaks_under_its_prediction(half_b: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MBUILD_ENGINE_CACHE": str(tmp_path / "engines")}
    plan = mbuild("plan", str(half_b), "--gpu", "cpu", "--precision", "int8", "--json")
    assert plan.returncode == 0, plan.stderr
    predicted = json.loads(plan.stdout)["memory"]["build_gb"] * 1e9
    run = run_sampled([sys.executable, "-m", "builder.cli", "package", str(half_b), "--backend", "none",
                       "--gpu", "cpu", "--precision", "int8", "--output", str(tmp_path / "out")], env)
    # Random weights may miss int8's gate (exit 8) after every stage that takes memory has run.
    assert run.rc in (0, ValidationFailed.exit_code), run.tail()
    assert (tmp_path / "out" / "report.json").is_file()
    peak = run.peak()[0]
    export = run.peak(*run.windows()["export"])[0]
    fp32_weights = 2 * sum(p.stat().st_size for p in half_b.glob("*.safetensors"))  # bf16: 2 bytes a weight
    print(f"peak {peak / GIB:.2f} GiB (predicted {predicted / GIB:.2f}), export stage {export / GIB:.2f} GiB, "
          f"fp32 weights {fp32_weights / GIB:.2f} GiB")
    assert peak <= predicted
    assert peak < fp32_weights


# The sizes issue 57 measured int4 builds at: ~0.41B (1.4 GiB of fp32 weights) and ~0.11B, Llamas of one bf16 file
MID_SHAPE: dict[str, Any] = {**SHAPE, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 20}
SMALL_SHAPE: dict[str, Any] = {**SHAPE, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
                               "num_attention_heads": 12}


def _peak(model: Path, out: Path, precision: str = "int4", anonymous: bool = False) -> tuple[int, int]:
    """(peak RSS of a build's process tree, or its anonymous RSS, the checkpoint's weights at fp32)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MBUILD_ENGINE_CACHE": str(out / "engines")}
    run = run_sampled([sys.executable, "-m", "builder.cli", "package", str(model), "--backend", "none", "--gpu", "cpu",
                       "--precision", precision, "--output", str(out / "build")], env)
    assert run.rc in (0, ValidationFailed.exit_code), run.tail()  # random weights may miss a quantized gate
    assert (out / "build" / "report.json").is_file()  # the gate ran: every stage that takes memory did
    return run.peak()[1 if anonymous else 0], 2 * sum(p.stat().st_size for p in model.glob("*.safetensors"))


def test_an_int4_build_peaks_under_half_its_fp32_weights_and_grows_sub_linearly(tmp_path: Path) -> None:
    """Issue 57: an int4 build of a ~410M Llama at 1.01x its fp32 bytes (0.38x before), growing 0.66 bytes of RSS
    per added weight byte from ~110M. The build streams weights and the gate loads a layer at a time, so the peak is
    the build process (~0.3 GiB: torch, ONNX Runtime) and a bounded block of rows, whatever the model's size: 0.59
    GiB (0.43x) in 8 fresh runs, the export's. Some gates had grown 48 MiB a layer to 1.42 GiB (1.04x), glibc
    serving each layer's weights from its fragmented heap (reference.py's _map_big_blocks).
    The bound is on anonymous RSS, what the build holds: the whole RSS also counts the libraries' mapped pages, which
    vary with the page cache (the same build measured 0.61 GiB in one venv and 0.69 in a fresh one of the same
    packages, its torch alone 239 against 305 MiB at import), against 0.69 allowed."""
    peaks = {}
    for name, shape in (("0.1b", SMALL_SHAPE), ("0.4b", MID_SHAPE)):
        model = save_random_decoder(LlamaConfig(**shape), tmp_path / f"llama-{name}", torch.bfloat16)
        peaks[name] = _peak(model, tmp_path / name, anonymous=True)
    (small_peak, small_fp32), (peak, fp32) = peaks["0.1b"], peaks["0.4b"]
    growth = (peak - small_peak) / (fp32 - small_fp32)
    print(f"int4 anonymous peaks: {small_peak / GIB:.2f} GiB at {small_fp32 / GIB:.2f} GiB of fp32 weights, "
          f"{peak / GIB:.2f} GiB at {fp32 / GIB:.2f} ({peak / fp32:.2f}x); {growth:.2f} bytes per added fp32 byte")
    assert peak <= 0.5 * fp32
    assert growth < 0.25  # sub-linear: a build holding the fp32 model would add about one byte per byte


def test_a_generic_build_peaks_under_its_fp32_weights_and_grows_sub_linearly(tmp_path: Path) -> None:
    """Issue 58: the generic path (a Cohere, which has no hand-written graph) at the default int8, the same two
    sizes. Its export's child holds PyTorch, torch.export and onnxscript (~0.65 GiB) but never the weights: they
    stay on the meta device and are streamed as the fast lane's are; the build's own process reads the config
    through transformers in a child too (builder/model/torch_free.py), or PyTorch would sit in it beside the
    export (0.33 GiB more: 1.21 and 1.28 GiB in CI). Measured by hand: 0.73 GiB at 0.28 GiB of fp32 weights, 0.84
    GiB at 1.25 (0.67x, the gate's), 0.11 bytes of RSS per added fp32 byte."""
    from transformers import CohereConfig

    peaks = {}
    for name, shape in (("0.1b", SMALL_SHAPE), ("0.4b", MID_SHAPE)):
        config = CohereConfig(**{**shape, "architectures": ["CohereForCausalLM"]}, tie_word_embeddings=True)
        model = save_random_decoder(config, tmp_path / f"cohere-{name}", torch.bfloat16)
        peaks[name] = _peak(model, tmp_path / name, "int8")
    (small_peak, small_fp32), (peak, fp32) = peaks["0.1b"], peaks["0.4b"]
    growth = (peak - small_peak) / (fp32 - small_fp32)
    print(f"generic int8 peaks: {small_peak / GIB:.2f} GiB at {small_fp32 / GIB:.2f} GiB of fp32 weights, "
          f"{peak / GIB:.2f} GiB at {fp32 / GIB:.2f} ({peak / fp32:.2f}x); {growth:.2f} bytes per added fp32 byte")
    assert peak <= fp32
    assert growth < 0.25


@pytest.mark.parametrize(("method", "precision"), [("gptq", "int4"), ("fp8", "int8")])
def test_a_prequantized_build_peaks_under_its_plan_and_grows_sub_linearly(method: str, precision: str,
                                                                          tmp_path: Path) -> None:
    """Issue 59: a GPTQ (int4, groups of 128, act-order) and an FP8 (128x128 blocks) Llama of the two sizes above,
    built at the profile the source suits. The checkpoint is decoded a band of rows at a time (a GPTQ weight's
    columns from its packed rows), never a bf16 copy, so the peak stays under the plan and grows sub-linearly."""
    import functools

    from tests.support import quantized_checkpoints as qc

    formats: dict[str, tuple[Any, dict[str, object]]] = {
        "gptq": (functools.partial(qc.gptq, bits=4, group=128, act_order=True, v2=False),
                 {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}),
        "fp8": (functools.partial(qc.fp8_blocks, block=128),
                {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})}
    quantize, quantization = formats[method]
    peaks = {}
    for name, shape in (("0.1b", SMALL_SHAPE), ("0.4b", MID_SHAPE)):
        source = save_random_decoder(LlamaConfig(**shape), tmp_path / f"llama-{name}")  # fp32: the writers' input
        model = qc.write(source, tmp_path / f"{method}-{name}", quantization, quantize, twin=False)
        fp32 = (source / "model.safetensors").stat().st_size
        plan = mbuild("plan", str(model), "--gpu", "cpu", "--precision", precision, "--json")
        assert plan.returncode == 0, plan.stderr
        predicted = json.loads(plan.stdout)["memory"]["build_gb"] * 1e9
        peaks[name] = _peak(model, tmp_path / name, precision)[0], fp32, predicted
    (small_peak, small_fp32, _), (peak, fp32, predicted) = peaks["0.1b"], peaks["0.4b"]
    growth = (peak - small_peak) / (fp32 - small_fp32)
    print(f"{method} {precision} peaks: {small_peak / GIB:.2f} GiB at {small_fp32 / GIB:.2f} GiB of fp32 weights, "
          f"{peak / GIB:.2f} GiB at {fp32 / GIB:.2f} (predicted {predicted / GIB:.2f}); {growth:.2f} bytes per "
          "added fp32 byte")
    assert peak <= predicted and small_peak <= peaks["0.1b"][2]
    assert growth < 0.25
