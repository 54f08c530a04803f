"""One contract between the scheduler and an engine (runtimes/engines/contract.py), and a row's states (rows.py).

mypy checks every engine below against SlotEngine (the annotation of ENGINES); this test checks the same at run
time, so a method renamed, dropped or given other parameters in one of them fails here as well as there. The fakes
stand in for the ONNX graph only: they must keep the real engine's contract to prove anything about the scheduler.
"""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

from runtimes.engines.contract import SlotEngine
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.step import StepOutput, Work
from runtimes.generation.rows import MOVES, IllegalMove, Row, RowStatus
from runtimes.generation.sampling import SamplerState, SamplingParams
from tests.support.scheduler_fakes import FakeEngine, request
from tests.support.scripted_model import ScriptedEngine

ENGINES: tuple[type[SlotEngine], ...] = (DecoderEngine, FakeEngine, ScriptedEngine)


def _members() -> dict[str, inspect.Signature | None]:
    """The Protocol's members: a method's signature, or None for a property."""
    found: dict[str, inspect.Signature | None] = {}
    for name, member in vars(SlotEngine).items():
        if isinstance(member, property):
            found[name] = None
        elif inspect.isfunction(member) and not name.startswith("_"):
            found[name] = inspect.signature(member)
    return found


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_every_engine_has_the_contract_s_members_with_its_parameters(engine: type) -> None:
    members = _members()
    assert {"step", "lengths", "truncate", "release", "forget", "read", "write", "copy", "keep"} <= set(members)
    for name, signature in members.items():
        # a property may be an attribute the engine sets in __init__ (DecoderEngine's lengths)
        assert hasattr(engine, name) or f"self.{name} = " in inspect.getsource(engine), f"{engine.__name__}: {name}"
        if signature is not None:
            theirs = inspect.signature(getattr(engine, name))
            assert list(theirs.parameters) == list(signature.parameters), f"{engine.__name__}.{name}"


def test_a_row_input_the_engine_cannot_take_fails_that_row_alone() -> None:
    engine = FakeEngine(slots=3)
    out = engine.step([Work(0, (1, 2)), Work(1, (3,), adapter="sql"), Work(2, (4,), embeddings=np.zeros((1, 8)))])
    assert isinstance(out, StepOutput) and set(out.logits) == {0} and set(out.errors) == {1, 2}
    assert "adapter" in str(out.errors[1]) and "embeddings" in str(out.errors[2])
    assert engine.lengths.tolist() == [2, 0, 0]  # the refused rows wrote nothing
    with pytest.raises(ValueError, match="embeddings"):
        Work(0, (1, 2), embeddings=np.zeros((3, 8)))  # one embedding a token


def _row() -> Row:
    async def made() -> Row:
        asked = request([1, 2, 3])
        return Row(asked, SamplerState.start(SamplingParams(max_tokens=4), asked.prompt), 0)
    return asyncio.run(made())


def test_a_row_walks_every_transition_and_refuses_every_other() -> None:
    row = _row()
    assert row.status is RowStatus.FILLING and not row.decoding
    row.filled_in()
    assert row.status is RowStatus.RUNNING and row.decoding
    row.request.sent = 64  # its reader is MAX_UNREAD events behind
    row.read_or_pause()
    assert row.status is RowStatus.PAUSED and row.decoding
    row.request.taken = 64  # it read
    row.read_or_pause()
    assert row.status is RowStatus.RUNNING
    row.filled = 3
    row.preempt()
    assert row.status is RowStatus.PREEMPTED and row.filled == 0 and not row.decoding
    row.refill()
    assert row.status is RowStatus.FILLING
    row.end()
    assert row.status is RowStatus.ENDED
    walked = {(RowStatus.FILLING, RowStatus.RUNNING), (RowStatus.RUNNING, RowStatus.PAUSED),
              (RowStatus.PAUSED, RowStatus.RUNNING), (RowStatus.RUNNING, RowStatus.PREEMPTED),
              (RowStatus.PREEMPTED, RowStatus.FILLING), (RowStatus.FILLING, RowStatus.ENDED)}
    legal = {(a, b) for a, targets in MOVES.items() for b in targets}
    assert walked <= legal
    for status in RowStatus:  # every move the diagram lacks is refused, and leaves the state as it was
        for target in RowStatus:
            if (status, target) in legal:
                continue
            row = _row()
            row._status = status  # placed there, to try the move from it
            with pytest.raises(IllegalMove, match=f"from {status.value} to {target.value}"):
                row._move(target)
            assert row.status is status


def test_an_ended_row_does_nothing_more() -> None:
    row = _row()
    row.end()
    for move in (row.filled_in, row.preempt, row.refill, row.end):
        with pytest.raises(IllegalMove):
            move()
