"""How the engine packs a step's works into ONNX Runtime calls (runtimes/engines/step.py): pure, no graph.

What the packing may do is bounded by the CPU attention kernel (one new-token count per call; several rows only
when each is one token or every slot is empty); the graph tests run the packed runs for real
(test_decoder_graph.py)."""

from __future__ import annotations

import pytest

from runtimes.engines.step import Work, pack

CONTEXT = 64


def test_decode_rows_at_any_lengths_share_one_run_padding_the_free_slots_between() -> None:
    runs = pack([Work(0, (5,)), Work(3, (6,)), Work(1, (7,))], [10, 3, 0, 40], CONTEXT)
    assert len(runs) == 1 and runs[0].first == 0 and runs[0].width == 1
    assert [w.slot if w else None for w in runs[0].rows] == [0, 1, None, 3]


def test_a_verify_row_or_a_later_chunk_runs_alone_and_first_chunks_of_empty_slots_share() -> None:
    lengths = [10, 12, 0, 0, 0]
    runs = pack([Work(0, (1,)), Work(1, (1, 2, 3, 4), 4), Work(2, (9,) * 8, 1), Work(3, (8,) * 6, 0)], lengths,
                CONTEXT)
    shapes = sorted((run.first, len(run.rows), run.width) for run in runs)
    assert shapes == [(0, 1, 1), (1, 1, 4), (2, 2, 8)]  # decode; verify alone; two first chunks padded to 8


def test_a_run_never_pads_a_slot_past_its_context_and_a_work_that_cannot_fit_is_refused() -> None:
    runs = pack([Work(0, (1,) * 3), Work(1, (2,) * 3)], [0, 0], 3)  # both fit exactly, side by side
    assert len(runs) == 1
    runs = pack([Work(0, (1,)), Work(2, (1,))], [5, 63, 5], CONTEXT)  # slot 1 is full: padding it would overflow
    assert len(runs) == 1 and runs[0].width == 1  # one token past 63 is 64: still fits
    with pytest.raises(ValueError, match="exceed the context"):
        pack([Work(0, (1, 2))], [63], CONTEXT)
    with pytest.raises(ValueError, match="one work per slot"):
        pack([Work(0, (1,)), Work(0, (2,))], [0], CONTEXT)
    with pytest.raises(ValueError):
        Work(0, (1,), logits=2)


def test_a_wide_run_never_spans_a_slot_another_run_of_the_step_fills_first() -> None:
    """A one-token first prompt at slot 1 runs with the decode rows, before the wider run: the two first chunks at
    slots 0 and 2 must not share a run over slot 1, which would then hold a past (found by the served 16-request
    test under load: "batch_size must be 1 when sequence_length > 1 and past context is given")."""
    runs = pack([Work(0, (1, 2, 3)), Work(1, (4,)), Work(2, (5, 6, 7)), Work(3, (8,))], [0, 0, 0, 9], CONTEXT)
    spans = sorted((run.first, len(run.rows), run.width) for run in runs)
    assert spans == [(0, 1, 3), (1, 3, 1), (2, 1, 3)]
