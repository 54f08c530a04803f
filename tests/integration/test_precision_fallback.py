"""The default CPU precision for a language model is the fastest that passes the gate: one that fails it is
passed over for the next, and says so; a precision the user pinned stands or fails as asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from builder.errors import ValidationFailed
from runtimes.bundle import load_engine_config
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outlier_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama with the activation outliers that break int8 (as LLM.int8() describes): four channels of the
    final norm at 1e4 that the LM head ignores (its weights for them are zero). fp32 is unchanged by them;
    int8's per-step activation scale is set by them, so every other channel rounds to zero."""
    folder = make_tiny_llama(tmp_path_factory.mktemp("outlier-llama"), train_steps=0, seed=1)
    weights = load_file(folder / "model.safetensors")
    weights["model.norm.weight"][:4] = 1e4
    weights["lm_head.weight"][:, :4] = 0
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_default_build_falls_back_from_int8_to_fp32_and_says_why(outlier_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = mbuild("package", str(outlier_llama), "--backend", "none", "--gpu", "cpu", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "int8 failed its gate (the compiled engine differs from transformers" in result.stderr
    assert "trying the next precision" in result.stderr and "Traceback" not in result.stderr
    assert load_engine_config(out / "model").precision == "fp32"
    plan = json.loads((out / "plan.json").read_text())
    assert any("int8 failed it on this model" in line for line in plan["profile"]["why"])
    assert json.loads((out / "report.json").read_text())["passed"] is True


def test_a_pinned_precision_is_not_replaced(outlier_llama: Path, tmp_path: Path) -> None:
    result = mbuild("package", str(outlier_llama), "--backend", "none", "--gpu", "cpu", "--precision", "int8",
                    "--output", str(tmp_path / "out"))
    assert result.returncode == ValidationFailed.exit_code, result.stderr
    assert "differs from transformers" in result.stderr and "trying the next" not in result.stderr
