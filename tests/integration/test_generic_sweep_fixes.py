"""Issue 58's generic export on model types that failed the sweep (profiles/model_sweep.json) for reasons that hold
for a class of models, each run through the sweep's own stages (tests/support/model_sweep.py: made tiny, planned,
exported fp32, gated against transformers): what each now ends in, passed or refused at plan time with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builder.engine.generic.export import write_generic
from builder.engine.weight_writer import LinearFormat, WeightFile
from builder.errors import UnsupportedModel
from tests.support.model_sweep import PASSED, sweep
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

# scalar constants (a fused projection's q/k/v picked by index, a scalar added, an expert's weight picked) kept
# scalar in the engine; the LM head narrowed to logits_at where torch.export's tracer calls stand-ins for the
# modules (a multimodal wrapper); a fused q|k|v transformers splits on load read as its parts; experts ONNX
# Runtime's MoE does not compute traced as transformers' batched implementation computes them; a streamed weight
# the modeling code reads itself (Falcon's linear layers compute input @ self.weight.T; Gemma 4's wrapper reads its
# token table for image positions, which a text graph then drops) traced as a placeholder, written as stored
PASSING = ("persimmon", "fuyu", "moshi", "phi4_multimodal", "jetmoe", "sarvam_moe", "minimax_m3_vl_text", "beam",
           "falcon", "gemma4")


def test_a_scalar_constant_is_written_as_a_scalar(tmp_path: Path) -> None:
    """A Gather by a scalar index drops the axis; by [1] it keeps it: the traced graph's scalars stay scalars."""
    with (tmp_path / "data").open("wb") as data:
        weights = WeightFile(data.fileno())
        weights.add("index", np.array(2, np.int64))
    assert list(weights.initializers[0].dims) == []
    assert onnx.numpy_helper.to_array(weights.initializers[0]).shape == ()


@pytest.mark.slow
def test_types_the_generic_export_now_builds_pass_their_gates(tmp_path: Path) -> None:
    rows = sweep(list(PASSING), tmp_path)
    assert [(r.model_type, r.outcome) for r in rows] == [(t, PASSED) for t in PASSING], [r.detail for r in rows]


@pytest.mark.slow
def test_experts_moe_does_not_compute_are_refused_in_a_quantized_build(tmp_path: Path) -> None:
    """Traced as they are, such experts keep their fp32 weights in the graph: an int8 build says so, not ships them."""
    from transformers import AutoConfig

    folder = make_tiny_llama(tmp_path / "model", train_steps=0, family="beam")
    with pytest.raises(UnsupportedModel) as refused:
        write_generic(folder, AutoConfig.from_pretrained(folder), tmp_path / "out", LinearFormat("int8"))
    assert "ONNX Runtime's MoE runs silu(gate) * up" in refused.value.message
    assert "would stay fp32, not int8" in refused.value.message and "--precision fp32" in (refused.value.hint or "")


@pytest.mark.slow
def test_attention_the_engine_does_not_compute_is_refused_with_why(tmp_path: Path) -> None:
    """Not a gate failure after the export: an encoder's attention (a BERT-style model whose config says it is no
    decoder) sees later tokens, and says so. (A mask or bias the model's own code computes is traced over a grown
    cache instead: test_generic_grown.py.)"""
    folder = make_tiny_llama(tmp_path / "encoder", train_steps=0, family="bert-generation")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_decoder": False}))
    result = mbuild("package", str(folder), "--backend", "none", "--gpu", "cpu", "--precision", "fp32",
                    "--output", str(tmp_path / "out"))
    assert result.returncode == 7 and "attention is not causal" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_the_same_model_configured_as_a_decoder_passes_its_gate(tmp_path: Path) -> None:
    folder = make_tiny_llama(tmp_path / "model", train_steps=0, family="bert-generation")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_decoder": True}))
    result = mbuild("package", str(folder), "--backend", "none", "--gpu", "cpu", "--precision", "fp32",
                    "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "greedy decode equal to transformers on 4/4 prompts" in result.stdout + result.stderr
