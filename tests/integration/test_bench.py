"""`mbuild bench` end to end through the real AIPerf: a 3-point sweep of the MiniLM image (run by Docker) and of
a language-model build (served here), the table, bench.json/csv and plots written, every number as AIPerf's own
CSV report has it; and the bad cases (nothing listening, an SLO no point meets, an image that is never ready) end
with their message and exit code, keeping what was measured."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.support.containers import docker
from tests.support.procs import mbuild

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SWEEP = ["--concurrency", "1,2,4", "--requests", "8"]


def _aiperf_csv(folder: Path) -> dict[str, dict[str, float]]:
    """AIPerf's own CSV summary (profile_export_aiperf.csv), read apart from the JSON mbuild reads: its per-request
    table (metric -> avg, p50, p90, ...) and its run table (metric -> value)."""
    rows: dict[str, dict[str, float]] = {}
    header: list[str] = []
    with (folder / "profile_export_aiperf.csv").open() as handle:
        for row in csv.reader(handle):
            if not row:
                continue
            if row[0] == "Metric":
                header = row[1:]
                continue
            rows[row[0]] = {k: float(v.replace(",", "")) for k, v in zip(header, row[1:], strict=False) if v}
    return rows


def _close(mine: float, theirs: float) -> bool:
    return mine == pytest.approx(theirs, rel=1e-3, abs=0.006)  # the CSV rounds to two decimals


def _agrees(out: Path, generates: bool) -> None:
    result = json.loads((out / "bench.json").read_text())
    assert [p["concurrency"] for p in result["points"]] == [1, 2, 4]
    assert result["measured"]["tool"] == "aiperf 0.13.0"
    for point in result["points"]:
        theirs = _aiperf_csv(out / "aiperf" / f"c{point['concurrency']}")
        for percentile in ("p50", "p90", "p99"):
            assert _close(point["latency"][percentile], theirs["Request Latency (ms)"][percentile])
        assert point["requests"] == theirs["Request Count"]["Value"] == 8 and point["errors"] == 0
        assert _close(point["request_rate"], theirs["Request Throughput (requests/sec)"]["Value"])
        rate = "Output Token Throughput (tokens/sec)" if generates else "Input Token Throughput (tokens/sec)"
        assert _close(point["tokens_per_s"], theirs[rate]["Value"])
        if generates:
            assert _close(point["ttft"]["p90"], theirs["Time to First Token (ms)"]["p90"])
            assert _close(point["tpot"]["p50"], theirs["Inter Token Latency (ms)"]["p50"])
            per_user = theirs.get("Output Token Throughput Per User (tokens/sec/user)") or theirs[
                "E2E Output Token Throughput (tokens/sec/user)"]  # the first needs responses of several chunks
            assert _close(point["per_user_tokens_per_s"], per_user["avg"])
            # every request was asked for exactly --osl tokens (ignore_eos), and that is what came back
            assert theirs["Total Output Tokens (tokens)"]["Value"] == 8 * 16
    for name in ("bench.csv", "frontier.png", "latency.png"):
        assert (out / name).stat().st_size > 0
    with (out / "bench.csv").open() as handle:
        assert [row["concurrency"] for row in csv.DictReader(handle)] == ["1", "2", "4"]


def test_bench_of_the_minilm_image(minilm_image: str, tmp_path: Path) -> None:
    out = tmp_path / "minilm"
    result = mbuild("bench", minilm_image, "-o", str(out), "--isl", "32", *SWEEP, "--slo", "latency=30s")
    assert result.returncode == 0, result.stderr
    assert "input tokens/s" in result.stdout and "$/M tokens" in result.stdout  # the table, on stdout
    _agrees(out, generates=False)
    measured = json.loads((out / "bench.json").read_text())
    assert measured["measured"]["kind"] == "image" and measured["measured"]["task"] == "embedding"
    assert measured["price"]["per_hour"] > 0  # the CPU profile's list price, times the cores it had
    assert "SLO (p90 latency <= 30000 ms)" in result.stderr
    assert docker("ps", "-aq", "--filter", f"ancestor={minilm_image}").stdout.strip() == ""  # stopped after


def test_bench_of_a_language_model_build(tiny_llm_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "llm"
    result = mbuild("bench", str(tiny_llm_build), "-o", str(out), "--isl", "32", "--osl", "16", *SWEEP)
    assert result.returncode == 0, result.stderr
    assert "output tokens/s" in result.stdout and "TTFT p90" in result.stdout
    _agrees(out, generates=True)
    assert "energy: " in result.stderr  # read, or the reason it cannot be


def test_bench_offline_reads_the_builds_own_tokenizer(tiny_llm_build: Path, tmp_path: Path) -> None:
    # HF_HUB_OFFLINE=1 (the quickstart's air-gapped setting): AIPerf looked the build's tokenizer folder up in the
    # Hub cache as a repo id, and every point failed ("no point was measured")
    out = tmp_path / "offline"
    result = mbuild("bench", str(tiny_llm_build), "-o", str(out), "--isl", "32", "--osl", "8", "--concurrency", "1",
                    "--requests", "4", env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    point = json.loads((out / "bench.json").read_text())["points"][0]
    assert point["requests"] == 4 and point["errors"] == 0


def test_an_slo_no_point_meets_keeps_the_sweep(tiny_llm_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "slo"
    result = mbuild("bench", str(tiny_llm_build), "-o", str(out), "--isl", "32", "--osl", "8", "--concurrency", "1",
                    "--requests", "4", "--slo", "ttft=0.001ms")
    assert result.returncode == 17, result.stderr
    assert "no point meets p90 ttft <= 0.001 ms" in result.stderr and "Traceback" not in result.stderr
    assert json.loads((out / "bench.json").read_text())["points"][0]["requests"] == 4


def test_nothing_listening_is_exit_16(tmp_path: Path) -> None:
    result = mbuild("bench", "http://127.0.0.1:9", "-o", str(tmp_path / "none"))
    assert result.returncode == 16 and "cannot reach http://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_image_never_ready_is_exit_16_with_its_log(minilm_image: str, tmp_path: Path) -> None:
    out = tmp_path / "late"
    result = mbuild("bench", minilm_image, "-o", str(out), "--ready-timeout", "1", "--concurrency", "1")
    assert result.returncode == 16 and "was not ready within 1 s" in result.stderr, result.stderr
    assert (out / "server.log").is_file()  # the container's log, kept for the user
    assert docker("ps", "-aq", "--filter", f"ancestor={minilm_image}").stdout.strip() == ""
