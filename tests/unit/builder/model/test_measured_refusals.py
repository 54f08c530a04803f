"""Issue 58: a model type the sweep saw refused at its export, for a reason config.json does not show, is refused
when planned, before any download, with the reason the sweep measured (builder/model/measured.py), as long as the
installed transformers is the one the record was made with; the sweep's own builds do not consult the record."""

from __future__ import annotations

import pytest
import transformers

from builder.errors import UnsupportedModel
from builder.model import measured
from builder.model.generic import language_family, standard_config

SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256}


def _export_refused() -> dict[str, str]:
    data = measured.record()
    assert data["transformers"] == transformers.__version__, "the record is of another transformers: regenerate it"
    return {r["model_type"]: r["detail"] for r in data["rows"] if r["outcome"] == "refused" and r["stage"] == "export"}


def test_each_type_refused_at_its_export_is_refused_when_planned_with_the_measured_line() -> None:
    found = _export_refused()
    assert found, "the record holds no export refusal to plan by"
    for model_type, detail in found.items():
        config = {**standard_config(model_type, {}), **SIZES, "model_type": model_type}
        with pytest.raises(UnsupportedModel) as refused:
            language_family(config)
        assert detail in refused.value.message and "measured at its export" in refused.value.message


def test_another_transformers_or_the_sweep_itself_does_not_read_the_record() -> None:
    model_type = next(iter(_export_refused()))
    assert measured.export_refusal(model_type, transformers.__version__) is not None
    assert measured.export_refusal(model_type, "0.0.1") is None
    measured.CONSULTED["on"] = False
    try:
        assert measured.export_refusal(model_type, transformers.__version__) is None
    finally:
        measured.CONSULTED["on"] = True
