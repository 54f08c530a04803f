"""bench.json and what follows from it: the frontier, the SLO point, cost per million tokens, energy per token; a
hostile or foreign result file, a bad --slo and a bad prompts file are clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from builder.benchmark import energy
from builder.benchmark.result import frontier, parse_slo, read_result, slo_point
from builder.benchmark.workloads import workload
from builder.errors import InputError
from tests.support.bench_results import point, sweep, write
from tests.support.hostile_cases import DEEP


def test_the_frontier_drops_the_points_another_beats_on_both_axes() -> None:
    points = (point(1, 40.0, 40.0, 100.0), point(2, 35.0, 30.0, 100.0), point(4, 130.0, 32.0, 200.0),
              point(8, 120.0, 31.0, 200.0))
    kept = [p.concurrency for p in frontier(points)]
    assert kept == [1, 4]  # c=2 is beaten by c=1 on both, c=8 by c=4


def test_the_slo_point_is_the_fastest_that_meets_every_bound() -> None:
    result = sweep()
    assert slo_point(result, parse_slo("ttft=500ms")).concurrency == 4  # type: ignore[union-attr]
    assert slo_point(result, parse_slo("ttft=500ms", percentile=50)).concurrency == 16  # type: ignore[union-attr]
    assert slo_point(result, parse_slo("ttft=1ms")) is None
    assert slo_point(result, parse_slo("ttft=10s,tpot=5ms")) is None  # every point's TPOT p90 is 30 ms


def test_an_embedder_has_no_ttft_so_a_ttft_bound_is_never_met() -> None:
    result = sweep()
    plain = tuple(p.__class__(**{**p.__dict__, "ttft": None}) for p in result.points)
    assert parse_slo("ttft=10s").misses(plain[0]) == ["no time to first token measured"]


def test_cost_per_million_tokens_is_the_hourly_price_over_the_hourly_tokens() -> None:
    result = sweep(price=3.6)
    p = result.points[0]  # 40 tokens/s: 144,000 tokens an hour for $3.60
    assert result.cost_per_million(p) == pytest.approx(3.6 / (40 * 3600) * 1e6)
    assert sweep(price=None).cost_per_million(p) is None


@pytest.mark.parametrize("text", ["", "ttft", "ttft=", "ttft=5", "ttft=-5ms", "ttft=0ms", "ttft=5h", "ttft=5ms;",
                                  "TTFT=5ms", "x" * 300, "ttft=9999999s", "ttft=1e3ms", "ttft=5ms,,tpot=3ms"])
def test_bad_slo_text_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_slo(text)


def test_a_result_round_trips_and_foreign_files_are_refused(tmp_path: Path) -> None:
    path = write(sweep("a" * 64), tmp_path / "ok")
    assert read_result(path.parent) == sweep("a" * 64)
    raw = json.loads(path.read_text())
    cases = {
        "not-json": "{",
        "list": "[]",
        "old-format": json.dumps({**raw, "format": 0}),
        "negative-rate": json.dumps({**raw, "points": [{**raw["points"][0], "tokens_per_s": -1}]}),
        "nan": path.read_text().replace('"tokens_per_s": 40.0', '"tokens_per_s": NaN'),
        "missing-field": json.dumps({k: v for k, v in raw.items() if k != "measured"}),
        "string-number": json.dumps({**raw, "points": [{**raw["points"][0], "concurrency": "4"}]}),
        "nested-100k-deep": DEEP.decode(),
        # printed by deploy --bench: a unit or profile that moves the cursor, colours or breaks the line
        "unit-escapes": json.dumps({**raw, "measured": {**raw["measured"], "unit": "tokens\x1b[2J\nreplicas: 0"}}),
        "profile-escapes": json.dumps({**raw, "measured": {**raw["measured"], "profile": "cpu\x1b]0;owned\x07"}}),
        "profile-bidi": json.dumps({**raw, "measured": {**raw["measured"], "profile": "cpu\u202efp32"}}),
        "long-source": json.dumps({**raw, "price": {**raw["price"], "source": "x" * 100_000}}),
    }
    for name, text in cases.items():
        bad = tmp_path / f"{name}.json"
        bad.write_text(text)
        with pytest.raises(InputError) as caught:
            read_result(bad)
        assert "bench result" in caught.value.message, name
    with pytest.raises(InputError):
        read_result(tmp_path / "absent.json")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it waited for a writer for ever; /dev/zero was read until memory ran out
    for endless, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device")):
        with pytest.raises(InputError) as refused:
            read_result(endless)
        assert f"is {kind}, not a regular file" in refused.value.message


def test_prompts_files_are_checked_line_by_line_and_rewritten(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "hello", "output_length": 12, "evil": "x"}\n\n{"text": "again"}\n')
    made = workload("chat", None, None, good)
    assert made.osl == 12
    assert [json.loads(line) for line in made.dataset.splitlines()] == [
        {"text": "hello", "output_length": 12}, {"text": "again"}]
    for text in ["", "not json\n", '{"text": ""}\n', '{"prompt": "x"}\n', '["x"]\n',
                 '{"text": "x", "output_length": 0}\n', '{"text": "x", "output_length": true}\n']:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(InputError):
            workload("chat", None, None, bad)
    with pytest.raises(InputError):
        workload("chat", 0, None, None)


def test_energy_comes_from_rapl_counters_across_a_wrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for /sys/class/powercap, which this machine lacks: the counter wraps at its range mid-point.
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    monkeypatch.setattr(energy, "POWERCAP", tmp_path)
    meter = energy.meter(local=True)
    assert meter.read is not None and "RAPL" in meter.how

    def work() -> str:
        (zone / "energy_uj").write_text("400000\n")  # 0.1 J to the wrap, 0.4 J after it
        return "done"
    assert meter.measure(work) == ("done", pytest.approx(0.5))


def test_energy_is_not_guessed_where_it_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy, "POWERCAP", tmp_path / "absent")
    assert energy.meter(local=True).read is None or "NVML" in energy.meter(local=True).how
    remote = energy.meter(local=False)
    assert remote.read is None and "elsewhere" in remote.how
