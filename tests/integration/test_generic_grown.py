"""Issue 58: a model whose modeling code computes attention itself (GPT-Neo's local windows, from the cache's
index) is traced whole over a grown cache (builder/engine/generic/grown.py) and decodes as transformers' generate
does, rows at different lengths batched (each row's past right-aligned, as the graph asks); one that keeps no
cache at all, or whose config says it is not causal, is refused when planned; one whose trace holds for some lengths
only (a branch on the length), or that takes the whole sequence each step, is refused at its export, not failed at
the gate; a slice by max(0, size - keys) (an alibi table's) exports and passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder
from builder.model.generic import computes_attention_itself, refusal, standard_config
from runtimes.bundle import Batching
from runtimes.engines.decoder import DecoderEngine
from tests.support.family_configs import decoded, generated
from tests.support.model_sweep import PASSED, REFUSED, sweep
from tests.support.tiny_models import make_tiny_llama

PROMPTS = [[1, 17, 99, 3, 250, 42, 7], [1, 200, 201, 202, 9, 9, 9, 9, 9, 30, 31, 32, 33, 34, 35, 36, 37, 38]]
NEW = 12


@pytest.mark.slow
def test_a_model_with_its_own_attention_decodes_batched_as_transformers_does(tmp_path: Path) -> None:
    folder = make_tiny_llama(tmp_path / "model", train_steps=0, family="gpt_neo")
    config = json.loads((folder / "config.json").read_text())
    assert computes_attention_itself("gpt_neo") and refusal("gpt_neo", standard_config("gpt_neo", config)) is None
    assert len(PROMPTS[1]) > config["window_size"] and "local" in str(config["attention_types"])
    exported = export_decoder(folder, tmp_path / "export")
    graph = onnx.load(str(tmp_path / "export" / "model.onnx"), load_external_data=False)
    assert not [n for n in graph.graph.node if n.domain == "com.microsoft" and "Attention" in n.op_type]
    optimize(tmp_path / "export" / "model.onnx", tmp_path / "engine" / "model.onnx")
    engine = DecoderEngine(tmp_path / "engine", exported.engine_config("onnxruntime", "model.onnx", "fp32",
                                                                       Batching(4, 0)), threads=1)
    assert not engine.in_place and engine.right_aligned
    first = [int(engine.run(row, np.array([prompt])).argmax()) for row, prompt in enumerate(PROMPTS)]
    assert decoded(engine, first, NEW) == generated(folder, PROMPTS, NEW)


@pytest.mark.parametrize("model_type", ["openai-gpt"])
def test_a_model_that_keeps_no_cache_is_refused_when_planned(model_type: str) -> None:
    assert computes_attention_itself(model_type)
    assert "keeps no KV cache" in (refusal(model_type, {"num_attention_heads": 4}) or "")


def test_a_model_whose_config_says_it_is_not_causal_is_refused_when_planned() -> None:
    """A masked language model transformers also maps as a causal LM (its config's causal: false) attends to later
    tokens: refused before the download, not failed at the gate."""
    assert "not causal" in (refusal("xlm", standard_config("xlm", {})) or "")
    assert refusal("xlm", standard_config("xlm", {"causal": True})) is None


# each type's stage and reason: Doge's dynamic mask keeps the top keys once they outnumber its window (a branch on
# the length); XLM's config says it is not causal; CPM-Ant's code takes the whole sequence each step
GROWN_REFUSED = {"doge": ("export", "branches on the sequence's length"), "xlm": ("plan", "not causal"),
                 "cpmant": ("export", "does not run new tokens over its cache")}


@pytest.mark.slow
def test_traces_that_do_not_hold_are_refused_before_the_gate_and_an_alibi_slice_passes(tmp_path: Path) -> None:
    rows = {r.model_type: r for r in sweep([*GROWN_REFUSED, "mpt"], tmp_path)}
    assert rows["mpt"].outcome == PASSED, rows["mpt"].detail
    for model_type, (stage, reason) in GROWN_REFUSED.items():
        row = rows[model_type]
        assert (row.outcome, row.stage) == (REFUSED, stage) and reason in row.detail, row
