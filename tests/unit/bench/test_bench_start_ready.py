"""The start-to-ready benchmark (bench/scenarios/start_ready.py) without servers: its options, the timeline mbuild's
server logs at ready read back into phases, and a process's imports summed by package."""

from __future__ import annotations

import os

import pytest

from bench.lib.start_phases import SEEN, imports_by_package, marks, median_spans, spans
from bench.scenarios import start_ready
from runtimes.startup import Timeline, now, started_at


def test_options_default_to_the_standard_starts_and_refuse_none() -> None:
    assert start_ready.parse_options([]) == {"starts": None, "before": None}
    assert start_ready.parse_options(["--starts", "3", "--before", "HEAD~1"]) == {"starts": 3, "before": "HEAD~1"}
    with pytest.raises(SystemExit):
        start_ready.parse_options(["--starts", "0"])


def test_the_ready_line_the_server_logs_reads_back_as_its_phases() -> None:
    timeline = Timeline(origin=now() - 1.0, since="the start")
    for phase, at in (("server process", 0.15), ("imports", 0.6), ("engine", 0.8), ("ready", 0.82)):
        timeline.mark(phase, timeline.origin + at)
    log = f"2026-01-01 INFO mbuild.runtime: model ready: model ({timeline.summary()})\nlater lines\n"
    assert log.count("0.82 s after the start: server process 0.15 s, imports 0.60 s")
    found = marks(log)
    assert list(found) == ["server process", "imports", "engine", "ready"]
    parts = spans(found, total=0.85)
    assert parts == pytest.approx({"server process": 0.15, "imports": 0.45, "engine": 0.2, "ready": 0.02, SEEN: 0.03})
    assert spans(found, total=0.81)[SEEN] == 0.0  # the marks' 10 ms steps may run ahead of the client's clock
    assert marks("a server that logs no timeline") == {} and spans({}, 1.0) == {}


def test_median_spans_over_starts_keep_the_order_phases_first_appear() -> None:
    starts = [{"imports": 0.5, "engine": 0.1}, {"imports": 0.7, "engine": 0.3}, {"imports": 0.6, "engine": 0.2}, {}]
    assert median_spans(starts) == pytest.approx({"imports": 0.6, "engine": 0.2})


def test_this_process_started_before_now_on_the_same_clock() -> None:
    began, parent = started_at(), started_at(os.getppid())
    assert began is not None and parent is not None and parent <= began <= now()
    assert started_at(2**31) is None  # no such process


def test_imports_are_summed_by_top_level_package_largest_first() -> None:
    importtime = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:      2000 |       2000 |     numpy._core",
        "import time:      1000 |       3000 |   numpy",
        "import time:      5000 |       5000 |   fastapi.routing",
        "import time:       500 |       8500 | runtimes.server",
        "some other line"])
    assert imports_by_package(importtime) == pytest.approx({"fastapi": 0.005, "numpy": 0.003, "runtimes": 0.0005})
    assert imports_by_package(importtime, top=1) == pytest.approx({"fastapi": 0.005, "the rest": 0.0035})
