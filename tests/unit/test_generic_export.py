"""Issue 58: the generic path (builder/engine/generic/) builds model types mbuild has no hand-written graph for,
at int8 (the default) and int4, dense and mixture-of-experts, packaged as a user packages them. The models are
trained a second on a short text (tests/support/tiny_models.py), so their predictions are decisive as a real
model's are; random weights' near-flat logits would pass or fail on luck. fp32 exactness for every type is the
sweep's (tests/integration/test_model_sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from builder.model.families import fast_lane
from runtimes.bundle import REPORT_FILE, load_engine_config, read_gate_report
from runtimes.bundle.report import DecoderReport
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow
# Cohere (LayerNorm, interleaved rotary, a logit scale); Qwen2-MoE (shared experts behind a sigmoid gate)
TYPES = {"cohere": set(), "qwen2_moe": {"QMoE"}}
NODES = {"int8": "MatMulInt8Tiles", "int4": "MatMulNBits"}


@pytest.fixture(scope="module", params=sorted(TYPES))
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert not fast_lane(request.param)  # else this tests the fast lane
    return make_tiny_llama(tmp_path_factory.mktemp(f"trained-{request.param}"), family=request.param)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_quantized_generic_build_passes_its_gate(trained: Path, precision: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = mbuild("package", str(trained), "--backend", "none", "--gpu", "cpu", "--precision", precision,
                    "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    kind = json.loads((trained / "config.json").read_text())["model_type"]
    assert f"generic: traced from transformers' own {kind!r} modeling code" in result.stdout + result.stderr
    assert load_engine_config(out / "model").precision == precision
    ops = {node.op_type for node in onnx.load(str(out / "model" / "model.onnx"), load_external_data=False).graph.node}
    # every linear layer quantized: no MatMul on a weight is left (the traced graph has no MatMul of its own here)
    assert NODES[precision] in ops and "MatMul" not in ops and TYPES[kind] <= ops
    report = read_gate_report(json.loads((out / "model" / REPORT_FILE).read_text()))
    assert isinstance(report, DecoderReport) and report.passed
    assert report.top1_agreement >= report.tolerance.min_top1 and not report.tolerance.greedy_exact
