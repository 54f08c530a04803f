"""int8 and int4 builds of a dense and a mixture-of-experts family pass their gates, packaged as a user packages
them: on the fast lane (Qwen3, Qwen3-MoE) and on the generic path (issue 58: Cohere, with LayerNorm, interleaved
rotary and a logit scale; Qwen2-MoE, with shared experts behind a sigmoid gate; no hand-written graph for
either). The models are trained a second on a short text (tests/support/tiny_models.py), so their predictions
are decisive as a real model's are: random weights' near-flat logits flip under any rounding and would test
nothing but luck. fp32 exactness for every family is test_decoder_graph.py's and the sweep's."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from builder.build.plan_package import PackageOptions, plan_package
from builder.engine import int8_tiles
from builder.engine.weight_writer import LinearFormat
from builder.model.families import export_path, fast_lane
from builder.planning.engine_options import ort_options
from builder.progress import Reporter
from runtimes.bundle import REPORT_FILE, load_engine_config, read_gate_report
from runtimes.bundle.report import DecoderReport
from runtimes.kernels import EXPERTS_OP
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow
FAMILIES = ("qwen3", "qwen3_moe", "cohere", "qwen2_moe")  # q/k norms; experts, quantized per expert


def _nodes(model: Path, precision: str) -> tuple[str, str]:
    """The nodes a quantized linear layer and a layer's experts are written as by the profile mbuild picks on this
    CPU (they differ by CPU class: profiles/cpu.yaml)."""
    plan = plan_package(PackageOptions(str(model), gpu="cpu", precision=precision, offline=True), Reporter(quiet=True))
    form = LinearFormat.for_profile(precision, ort_options(plan.profile.engine_options))
    if form.tiles:
        return int8_tiles.OP, EXPERTS_OP
    return "DynamicQuantizeMatMul" if form.kind == "int8" else "MatMulNBits", "QMoE"


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp(f"trained-{request.param}"), family=request.param)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_quantized_build_passes_its_gate(trained: Path, precision: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = mbuild("package", str(trained), "--backend", "none", "--gpu", "cpu", "--precision", precision,
                    "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    kind = json.loads((trained / "config.json").read_text())["model_type"]
    assert export_path(kind) in result.stdout + result.stderr  # which path built it, said
    assert load_engine_config(out / "model").precision == precision
    if not fast_lane(kind):  # every nn.Linear quantized (the traced graph has no MatMul of its own here; Qwen2-MoE's
        # router is its own module, a small fp32 parameter traced as it is), the experts as QMoE or mbuild's kernel
        graph = onnx.load(str(out / "model" / "model.onnx"), load_external_data=False).graph
        ops = {node.op_type for node in graph.node}
        linear, experts = _nodes(trained, precision)
        assert linear in ops and "MatMul" not in ops
        assert (experts in ops) == (kind == "qwen2_moe")
    report = read_gate_report(json.loads((out / "model" / REPORT_FILE).read_text()))
    assert isinstance(report, DecoderReport) and report.passed
    assert report.top1_agreement >= report.tolerance.min_top1 and not report.tolerance.greedy_exact


def test_an_fp32_gate_passes_a_model_whose_greedy_pick_is_an_end_token(tmp_path: Path) -> None:
    """The gate decodes NEW_TOKENS for every prompt, end tokens forbidden (min_tokens): the reference must pick
    among the same tokens. This random Llama's own greedy decode ends early on a gate prompt, so the gate
    compared an end token with the engine's forced pick, and failed an exact engine, before it did."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from builder.engine.validate_decoder import NEW_TOKENS, PROMPTS

    folder = make_tiny_llama(tmp_path / "random", train_steps=0, seed=0)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    ends = set(model.generation_config.eos_token_id)
    with torch.inference_mode():
        made = [model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=NEW_TOKENS, do_sample=False)
                for text in PROMPTS]
    assert any(ends & set(ids[0].tolist()[-NEW_TOKENS:]) for ids in made)  # the case arises here
    result = mbuild("package", str(folder), "--backend", "none", "--gpu", "cpu", "--precision", "fp32",
                    "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
