"""The default CPU precision for a language model is the fastest that passes the gate: one that fails it is
passed over for the next, and says so; a precision the user pinned stands or fails as asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.errors import ValidationFailed
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Untrained: flat logits, on which int4's rounding flips top-1 far more than int8's (0.71 vs 0.98)."""
    return make_tiny_llama(tmp_path_factory.mktemp("random-llama"), train_steps=0, seed=1)


def test_a_default_build_falls_back_from_int4_to_int8_and_says_why(random_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = mbuild("package", str(random_llama), "--backend", "none", "--gpu", "cpu", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "int4 failed its gate (the compiled engine differs from transformers" in result.stderr
    assert "trying the next precision" in result.stderr and "Traceback" not in result.stderr
    engine = json.loads((tmp_path / "out" / "model" / "engine.json").read_text())
    assert engine["options"]["precision"] == "int8"
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert any("int4 failed it on this model" in line for line in plan["profile"]["why"])


def test_a_pinned_precision_is_not_replaced(random_llama: Path, tmp_path: Path) -> None:
    result = mbuild("package", str(random_llama), "--backend", "none", "--gpu", "cpu", "--precision", "int4",
                    "--output", str(tmp_path / "out"))
    assert result.returncode == ValidationFailed.exit_code, result.stderr
    assert "differs from transformers" in result.stderr and "trying the next" not in result.stderr
