"""The paired before/after benchmark (bench/scenarios/code_pair.py) without servers: its options, and a report whose
after / before ratios pair the rounds one by one, on a page whose header the index reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib.harness import write
from bench.lib.llm_peer_report import METRICS
from bench.lib.llm_peer_shapes import QUICK
from bench.lib.page_header import read
from bench.scenarios import code_pair


def test_options_default_to_the_100m_shape_and_refuse_an_unknown_one() -> None:
    assert code_pair.parse_options(["--before", "abc123"]) == {"before": "abc123", "shapes": ["100m"]}
    assert code_pair.parse_options(["--before", "x", "--shapes", "100m,1b"])["shapes"] == ["100m", "1b"]
    assert code_pair.parse_options([])["before"] is None  # `all --quick` passes none: a quick run uses HEAD
    with pytest.raises(SystemExit):
        code_pair.parse_options(["--before", "x", "--shapes", "7b"])


def test_a_full_run_needs_before(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--before REF is required"):
        code_pair.main(repeats=1, out=tmp_path, work=tmp_path)


def rounds(rates: list[float], tpot: float) -> list[dict[str, float]]:
    return [{**dict.fromkeys(METRICS, 1.0), "total_tok_s": rate, "tpot_p50_ms": tpot} for rate in rates]


def test_the_report_pairs_rounds_and_writes_a_page_with_its_header(tmp_path: Path) -> None:
    key = QUICK.key
    runs = {f"{key} before c=1": rounds([100, 200, 100], 10), f"{key} after c=1": rounds([110, 180, 100], 10),
            f"{key} before c=4": rounds([400, 400, 400], 20), f"{key} after c=4": rounds([420, 440, 460], 19)}
    results = {"runs": runs, "builds": {key: {}}, "ungated": {key: {"after": "top-1 0.85"}}, "repeats": 3,
               "ready_mb": {key: {"before": 400.0, "after": 380.0}},
               "before": "HEAD~1 (abc)", "after": "src-123", "machine": {
                   "cpu": "x86_64, Some CPU", "cores": 2, "date": "2026-12-07", "commit": "abc1234",
                   "command": "python -m bench code_pair --before 'HEAD~1' --repeats 3"}}
    data, markdown = code_pair.report(results, [QUICK], quick=False)
    assert data["ratios"][f"{key} c=1"]["total_tok_s"]["values"] == [1.1, 0.9, 1.0]  # round by round
    assert data["ratios"][f"{key} c=4"]["total_tok_s"]["median"] == pytest.approx(1.1)
    assert "total tokens/s 1.000x (0.900-1.100)" in markdown and "the tokens/s range holds 1.000" in markdown
    assert "total tokens/s 1.100x (1.050-1.150)" in markdown and "does not hold 1.000" in markdown
    assert "| 4 | after | 440.0 (420.0-460.0) | 1.0 | 19.00 |" in markdown
    assert "- after: its engine failed the gate on this random model (top-1 0.85)" in markdown
    assert "memory at ready (the server's process tree's RSS, before any request): before 400 MB, after 380 MB " \
           "(0.950x)" in markdown
    page = write("code_pair", data, markdown, tmp_path, measures=code_pair.MEASURES)
    assert read(page).command == "`python -m bench code_pair --before 'HEAD~1' --repeats 3`"
    assert json.loads((tmp_path / "code_pair.json").read_text())["ratios"] == data["ratios"]
