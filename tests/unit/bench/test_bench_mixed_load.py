"""The mixed-step benchmark's accounting (bench/lib/mixed_load.py): which gaps of the running streams count as
"during" the long prompts' window and which as the quiet baseline, and the summary a report reads."""

from __future__ import annotations

import pytest

from bench.lib.mixed_load import Round, split, summary, words


def test_gaps_are_split_at_the_window_by_where_they_end() -> None:
    # window (2.0, 5.0]: the long prompts were sent at 2.0 and 3.0, answered at 4.0 and 5.0
    stream = [0.0, 1.0, 2.0, 2.5, 4.5, 5.0, 6.0]
    found = split([stream], [(2.0, 4.0), (3.0, 5.0)])
    assert found.gaps_quiet == [1000.0, 1000.0]  # 0->1 and 1->2 (ends at the start: quiet)
    assert found.gaps_during == [500.0, 2000.0, 500.0]  # 2->2.5, 2.5->4.5 (the stall), 4.5->5 (ends at the end)
    assert found.long_ttft == [2000.0, 2000.0]
    assert found.window == 3.0  # 5.0->6.0 ends after the window: in neither


def test_every_stream_counts() -> None:
    found = split([[0.0, 1.5, 3.0], [0.5, 2.5]], [(1.0, 3.0)])
    assert sorted(found.gaps_during) == [1500.0, 1500.0, 2000.0]
    assert found.gaps_quiet == []


def test_the_summary_reads_the_tail_of_the_gaps_during() -> None:
    rounds = [Round(gaps_during=[10.0] * 97 + [500.0] * 3, gaps_quiet=[10.0] * 10, long_ttft=[800.0], window=2.0),
              Round(gaps_during=[10.0] * 100, gaps_quiet=[11.0] * 10, long_ttft=[900.0], window=2.0)]
    found = summary(rounds)
    assert found["gap_p50_ms"] == 10.0
    assert found["gap_max_ms"] == 500.0
    assert found["gap_p99_ms"] == 500.0  # 3 stalls in 200 gaps reach the top percent
    assert summary([Round(gaps_during=[10.0] * 199 + [500.0], long_ttft=[1.0], window=1.0)])["gap_p99_ms"] == 10.0
    assert found["gaps_during"] == 200
    assert found["long_ttft_p50_ms"] == pytest.approx(850.0)
    assert found["stream_tokens_in_window_per_s"] == pytest.approx(200 / 4.0)


def test_prompts_are_one_word_per_token_and_differ_by_seed() -> None:
    first, second = words(64, 1).split(), words(64, 2).split()
    assert len(first) == 64 and all(w.startswith("w") and 3 <= int(w[1:]) < 31003 for w in first)
    assert first != second
