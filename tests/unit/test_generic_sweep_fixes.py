"""Issue 58's generic export on model types that failed the sweep (docs/model_sweep.json) for reasons that hold
for a class of models, each run through the sweep's own stages (tests/support/model_sweep.py: made tiny, planned,
exported fp32, gated against transformers): what each now ends in, passed or refused at plan time with its reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builder.engine.weight_writer import WeightFile
from tests.support.model_sweep import PASSED, sweep

# scalar constants (a fused projection's q/k/v picked by index, a scalar added) kept scalar in the engine; the LM
# head narrowed to logits_at where torch.export's tracer calls stand-ins for the modules (a multimodal wrapper)
PASSING = ("persimmon", "fuyu", "moshi", "phi4_multimodal")


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
