"""Issue 58: models whose layers keep a recurrent state (state-space layers, linear attention), alone or beside
attention layers, are built from transformers' own cache API (builder/engine/generic/states.py): the states are
graph inputs and outputs, the engine keeps one per slot (runtimes/engines/states.py), starts a sequence from
zeros, steps a prompt one token a run and pads no worked row. One whose code keeps its state outside
transformers' Cache is refused when planned, saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builder.engine.compile_ort import optimize
from builder.engine.export_decoder import export_decoder
from builder.model.generic import refusal, standard_config
from runtimes.bundle import Batching, BundleError
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.states import States
from runtimes.engines.step import Work, one_at_a_time, pack
from tests.support.family_configs import decoded, generated
from tests.support.tiny_models import make_tiny_llama

PROMPTS = [[1, 17, 99, 3, 250, 42, 7], [1, 200, 201, 202, 9, 9, 9, 9, 9, 30, 31, 32, 33, 34, 35, 36, 37, 38]]
NEW = 10


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DecoderEngine]:
    """Qwen3-Next made tiny: gated delta-rule layers (a convolution state and a recurrent state each) beside
    full-attention layers."""
    tmp = tmp_path_factory.mktemp("hybrid")
    folder = make_tiny_llama(tmp / "model", train_steps=0, family="qwen3_next")
    exported = export_decoder(folder, tmp / "export")
    optimize(tmp / "export" / "model.onnx", tmp / "engine" / "model.onnx")
    engine = DecoderEngine(tmp / "engine", exported.engine_config("onnxruntime", "model.onnx", "fp32", Batching(4, 0)),
                           threads=1)
    return folder, engine


@pytest.mark.slow
def test_a_hybrid_decodes_batched_as_transformers_does_and_a_reused_slot_starts_from_zero(
        hybrid: tuple[Path, DecoderEngine]) -> None:
    folder, engine = hybrid
    config = json.loads((folder / "config.json").read_text())
    assert {"linear_attention", "full_attention"} <= set(config["layer_types"])
    assert engine.states and engine.one_token and not engine.in_place
    assert 0 < engine.layers < len(config["layer_types"])  # the attention layers alone hold keys and values
    want = generated(folder, PROMPTS, NEW)
    first = [int(engine.run(row, np.array([prompt])).argmax()) for row, prompt in enumerate(PROMPTS)]
    assert decoded(engine, first, NEW) == want
    # slot 0 again, for the second prompt: what the first sequence left in its state is not carried over
    for row in range(2):
        engine.release(row)
    again = int(engine.run(0, np.array([PROMPTS[1]])).argmax())
    assert again == want[1][0]


@pytest.mark.slow
def test_a_state_cannot_be_taken_back_or_restored_part_way(hybrid: tuple[Path, DecoderEngine]) -> None:
    _, engine = hybrid
    engine.keep(3, 0)
    engine.run(3, np.array([[1, 2, 3]]))
    with pytest.raises(ValueError, match="cannot be taken back"):
        engine.truncate(3, 1)
    with pytest.raises(ValueError, match="part way"):
        engine.keep(3, 2)


def test_a_stateful_step_pads_no_worked_row() -> None:
    works = [Work(0, (5,)), Work(1, (1, 2)), Work(2, (7,)), Work(3, (4, 4))]
    runs = pack(works, [0, 0, 0, 0], 64, equal=True)
    assert all(len(w.tokens) == run.width for run in runs for w in run.rows if w is not None)
    assert runs[0].width == 1 and [w.slot for w in runs[0].rows if w is not None] == [0, 2]  # one run for both
    assert any(w is not None and len(w.tokens) < run.width for run in pack(works, [0, 0, 0, 0], 64)
               for w in run.rows)  # where padding is harmless, it is what a step packs


def test_one_token_at_a_time_keeps_order_and_the_asked_logits() -> None:
    steps = one_at_a_time([Work(0, (1, 2, 3), logits=2), Work(1, (9,))])
    assert [[(w.slot, w.tokens, w.logits) for w in step] for step in steps] == [
        [(0, (1,), 0), (1, (9,), 1)], [(0, (2,), 1)], [(0, (3,), 1)]]


@pytest.mark.parametrize(("model_type", "planned"), [("jamba", True), ("mamba2", True), ("rwkv", False)])
def test_a_state_kept_outside_transformers_cache_is_refused_when_planned(model_type: str, planned: bool) -> None:
    why = refusal(model_type, standard_config(model_type, {}))
    assert (why is None) == planned, why
    if not planned:
        assert "outside transformers' Cache" in (why or "")


def _session(tmp_path: Path, inputs: dict[str, list[int | str]]) -> Any:
    """A real ONNX Runtime session of a graph that hands each input back (what the engine reads of a graph's
    states is their names, types and shapes)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", [name], [f"out.{name}"]) for name in inputs], "states",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [onnx.helper.make_tensor_value_info(f"out.{name}", onnx.TensorProto.FLOAT, None) for name in inputs])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 9
    return ort.InferenceSession(model.SerializeToString())


@pytest.mark.parametrize(("inputs", "said"), [
    ({"state.0": ["batch", "width"]}, "fixed sizes past its batch"),
    ({"state.0": ["batch", 4], "state.2": ["batch", 4]}, "must be numbered"),
    ({"state.0": ["batch"]}, "fixed sizes past its batch"),
])
def test_a_graph_whose_states_are_not_fixed_rows_is_refused(tmp_path: Path, inputs: dict[str, list[int | str]],
                                                            said: str) -> None:
    with pytest.raises(BundleError, match=said):
        States(_session(tmp_path, inputs), slots=2)


def test_a_new_sequence_starts_from_zeros_and_padding_keeps_no_state(tmp_path: Path) -> None:
    states = States(_session(tmp_path, {"state.0": ["batch", 3]}), slots=3)
    states.buffers[0][:] = 7.0
    fed = states.feeds(slice(0, 3), np.array([0, 5, 2]))["state.0"]
    assert (fed[0] == 0).all() and (fed[1:] == 7).all()
    states.store(slice(0, 3), [Work(0, (1,)), None, Work(2, (4,))], 1, [np.full((3, 3), 9.0, np.float32)])
    assert states.buffers[0][:, 0].tolist() == [9.0, 7.0, 9.0]
    assert states.bytes_per_slot == 12
