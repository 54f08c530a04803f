"""int8 and int4 builds of a dense and a mixture-of-experts family pass their gates, packaged as a user packages
them. The models are trained a second on a short text (tests/support/tiny_models.py), so their predictions
are decisive as a real model's are: random weights' near-flat logits flip under any rounding and would test
nothing but luck. fp32 exactness for every family is test_decoder_graph.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtimes.bundle import REPORT_FILE, load_engine_config, read_gate_report
from runtimes.bundle.report import DecoderReport
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow
FAMILIES = ("qwen3", "qwen3_moe")  # Qwen3's q/k norms; Qwen3-MoE's experts, quantized per expert


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp(f"trained-{request.param}"), family=request.param)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_quantized_build_passes_its_gate(trained: Path, precision: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = mbuild("package", str(trained), "--backend", "none", "--gpu", "cpu", "--precision", precision,
                    "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_engine_config(out / "model").precision == precision
    report = read_gate_report(json.loads((out / "model" / REPORT_FILE).read_text()))
    assert isinstance(report, DecoderReport) and report.passed
    assert report.top1_agreement >= report.tolerance.min_top1 and not report.tolerance.greedy_exact
