"""Issue 59, "Done when" 1: a tiny model written in each pre-quantized format (tests/support/quantized_checkpoints.py)
packages with `mbuild package`, on the fast lane and the generic export, and the engine's greedy decode (the gate's:
the serving scheduler, 4 prompts x 32 tokens) equals transformers' on the dequantized twin, values decoded by the
spec in the tests and not by mbuild. One of them is served, and a completion's tokens are transformers' greedy
ones."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from builder.build.plan_package import PackageOptions, plan_package
from builder.engine.validate_decoder import run_gate
from builder.progress import Reporter
from tests.support import quantized_checkpoints as qc
from tests.support.family_configs import family_configs
from tests.support.procs import mbuild, served
from tests.support.tiny_models import make_tiny_llama, save_random_decoder

pytestmark = [pytest.mark.slow, pytest.mark.integration]
QWEN3: dict[str, tuple[dict[str, Any], Any, str]] = {
    "gptq-v1-act-order": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True},
                          functools.partial(qc.gptq, bits=4, group=32, act_order=True, v2=False), "fast-lane"),
    "gptq-v2": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2", "sym": False},
                functools.partial(qc.gptq, bits=4, group=32, act_order=False, v2=True), "generic"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"},
            functools.partial(qc.awq, group=32), "generic"),
    "fp8-blocks": ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32]},
                   functools.partial(qc.fp8_blocks, block=32), "fast-lane"),
}
CASES = [*QWEN3, "gpt-oss-mxfp4", "deepseek-v3-fp8", "qwen3-moe-fp8", "compressed-tensors-w4a16"]


def _written(kind: str, root: Path) -> Path:
    if kind == "gpt-oss-mxfp4":
        source = save_random_decoder(family_configs()["gpt_oss"], root / "gpt-oss")
        return qc.write(source, root / kind, {"quant_method": "mxfp4"}, qc.mxfp4, qc.experts)
    if kind == "deepseek-v3-fp8":  # the FP8 block-scaled model the field's benchmarks run, shaped tiny
        source = make_tiny_llama(root / "deepseek-v3", train_steps=0, family="deepseek_v3")
        return qc.write(source, root / kind, QWEN3["fp8-blocks"][0], QWEN3["fp8-blocks"][1])
    if kind == "qwen3-moe-fp8":  # experts a tensor each, as Qwen3-30B-A3B-FP8 stores them; UE8M0 scales
        source = save_random_decoder(family_configs()["qwen3_moe"], root / "qwen3-moe")
        return qc.write(source, root / kind, QWEN3["fp8-blocks"][0],
                        functools.partial(qc.fp8_blocks, block=32, e8m0=True))
    if kind == "compressed-tensors-w4a16":  # written by the library, as llm-compressor saves W4A16
        return qc.compressed(save_random_decoder(family_configs()["qwen3"], root / "qwen3"), root / kind,
                             "pack-quantized", 4, True, 32)
    quantization, quantize, _ = QWEN3[kind]
    return qc.write(save_random_decoder(family_configs()["qwen3"], root / "qwen3"), root / kind, quantization,
                    quantize)


@pytest.mark.parametrize("kind", CASES)
def test_a_prequantized_checkpoint_packages_and_decodes_as_its_dequantized_twin(kind: str, tmp_path: Path) -> None:
    folder = _written(kind, tmp_path)
    impl = QWEN3[kind][2] if kind in QWEN3 else "auto"
    out = tmp_path / "build"
    done = mbuild("package", str(folder), "--gpu", "cpu", "--precision", "fp32", "--backend", "none",
                  "--model-impl", impl, "-o", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "validation  passed" in done.stderr and "Traceback" not in done.stderr
    assert "checkpoint, dequantized)" in done.stderr  # the gate says what its reference ran
    engine = next(found.parent for found in out.rglob("engine.json"))
    written = json.loads((engine / "engine.json").read_text())
    assert written["source_format"].split()[0] in {"gptq", "awq", "fp8", "mxfp4", "compressed-tensors"}
    assert written["requantized"] is False  # fp32 keeps the decoded values
    plan = plan_package(PackageOptions(str(folder), gpu="cpu", precision="fp32", offline=True), Reporter(quiet=True))
    twin = run_gate(folder.with_name(folder.name + "-dequantized"), engine, plan.profile.tolerance,
                    tmp_path / "twin.json")
    assert twin.passed, twin.verdict


def test_a_gptq_build_serves_transformers_greedy_tokens(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _written("gptq-v1-act-order", tmp_path)
    out = tmp_path / "build"
    assert mbuild("package", str(folder), "--gpu", "cpu", "--precision", "fp32", "--backend", "none",
                  "-o", str(out)).returncode == 0
    prompt = [5, 9, 17, 33, 65]
    model = AutoModelForCausalLM.from_pretrained(folder.with_name(folder.name + "-dequantized"), dtype=torch.float32)
    with torch.inference_mode():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    with served(out) as url:
        got = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                         "ignore_eos": True}, timeout=60)
    assert got.status_code == 200, got.text
    words = str(AutoTokenizer.from_pretrained(folder).decode(expected))  # a word per token: t{id}
    assert got.json()["choices"][0]["text"].split() == words.split(), (got.json(), expected)


def test_an_int4_build_of_a_gptq_checkpoint_keeps_its_codes(tmp_path: Path) -> None:
    """Groups of 128 are the int4 profile's blocks: engine.json says the weights were not rounded again (the
    writer's exactness is tests/unit/builder/engine/test_prequantized.py's), and the gate passes against the
    dequantized source."""
    config = family_configs()["qwen3"]
    config.hidden_size, config.intermediate_size = 128, 256
    source = save_random_decoder(config, tmp_path / "fp32")
    folder = qc.write(source, tmp_path / "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
                      functools.partial(qc.gptq, bits=4, group=128, act_order=False, v2=False))
    out = tmp_path / "build"
    done = mbuild("package", str(folder), "--gpu", "cpu", "--precision", "int4", "--backend", "none", "-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads(next(out.rglob("engine.json")).read_text())
    assert (written["precision"], written["source_format"], written["requantized"]) == ("int4", "gptq int4 g128", False)
