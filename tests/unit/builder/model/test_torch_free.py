"""Planning a model the generic export builds reads its config through transformers' config classes, which import
PyTorch; a process without PyTorch (the CLI's) reads it in a child (builder/model/torch_free.py), so the build's
own process stays small beside its export's child. The same call in a process that has PyTorch (this one) runs in
place: both must give the same plan, and the same refusal."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import CohereConfig, RwkvConfig

from builder.errors import UnsupportedModel
from builder.model.generic import language_family

SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# plans a config.json in a fresh interpreter: its family, or the refusal's type and line; whether PyTorch got in
SCRIPT = """
import json, sys
from builder.errors import MbuildError
from builder.model.generic import language_family
try:
    text, family = language_family(json.loads(sys.argv[1]))
    got = {"config": text, "kind": family.kind}
except MbuildError as exc:
    got = {"error": type(exc).__name__, "message": exc.message}
print(json.dumps({**got, "torch": "torch" in sys.modules}))
"""


def _in_fresh_process(config: dict[str, object]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(config)], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


def test_a_generic_plan_reads_transformers_in_a_child_and_gets_what_this_process_gets() -> None:
    config = {"model_type": "cohere", **SIZES}  # the rest from the class's defaults
    got = _in_fresh_process(config)
    assert got["torch"] is False  # the planning process never imported PyTorch
    text, family = language_family(config)  # here PyTorch is loaded: read in place
    assert got["config"] == text and got["kind"] == family.kind == "dense"
    assert text["layer_norm_eps"] == CohereConfig().layer_norm_eps  # the class's default, beneath config.json


def test_a_refusal_made_in_the_child_reaches_the_planner_as_it_is() -> None:
    config = RwkvConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256, bos_token_id=1, eos_token_id=2).to_dict()
    got = _in_fresh_process(config)
    with pytest.raises(UnsupportedModel) as here:
        language_family(config)
    assert got["torch"] is False
    assert got["error"] == "UnsupportedModel" and got["message"] == here.value.message
    assert "recurrent" in here.value.message
