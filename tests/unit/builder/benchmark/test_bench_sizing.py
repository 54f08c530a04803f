"""Sizing from a bench result: `mbuild deploy/plan --bench R --tokens-per-day 500000000 --slo ttft=500ms` write
the replica range that follows from the arithmetic they print, into the k8s objects and the Helm chart."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from builder.benchmark.result import parse_slo, slo_point
from tests.support.bench_results import point, sweep, write
from tests.support.deploy_cases import cli, image_for, plan_file

DAY = 500_000_000


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plan_file("minilm-cpu", tmp_path_factory.mktemp("plan"))


def _profile_id(plan: Path) -> str:
    return str(json.loads(plan.read_text())["profile"]["id"])


def _checked_arithmetic(stderr: str, bench: Path) -> tuple[int, int]:
    """The printed sizing lines, recomputed: the per-replica rate is the SLO point's in bench.json, and each
    ceiling follows from the numbers printed beside it."""
    per = float(re.search(r"one replica serves ([0-9.]+)", stderr).group(1))  # type: ignore[union-attr]
    result = json.loads(bench.read_text())
    meeting = [p for p in result["points"] if p["ttft"]["p90"] <= 500 and p["errors"] == 0]
    assert per == pytest.approx(max(p["tokens_per_s"] for p in meeting), abs=0.05)
    mean = re.search(rf"{DAY} output tokens/day / 86400 s = ([0-9.]+)/s -> ceil\(([0-9.]+) / ([0-9.]+)\) = "
                     r"(\d+) replica", stderr)
    peak = re.search(r"x peak factor 2 = ([0-9.]+)/s -> ceil\(([0-9.]+) / ([0-9.]+)\) = (\d+) replica", stderr)
    assert mean and peak, stderr
    assert float(mean.group(1)) == pytest.approx(DAY / 86400, abs=0.05)
    assert float(peak.group(1)) == pytest.approx(2 * DAY / 86400, abs=0.05)
    low, high = int(mean.group(4)), int(peak.group(4))
    assert low == math.ceil(DAY / 86400 / per) and high == math.ceil(2 * DAY / 86400 / per)
    return low, high


def test_k8s_and_helm_carry_the_replicas_the_arithmetic_gives(plan: Path, tmp_path: Path) -> None:
    bench = write(sweep(_profile_id(plan)), tmp_path / "bench")
    sizing = ["--bench", str(bench), "--tokens-per-day", str(DAY), "--slo", "ttft=500ms"]
    k8s = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), *sizing)
    assert k8s.returncode == 0, k8s.stderr
    low, high = _checked_arithmetic(k8s.stderr, bench)
    assert (low, high) == (45, 90)  # the sweep's c=4 point (130 tokens/s) is the highest with p90 TTFT <= 500 ms
    objects = {o["kind"]: o for o in yaml.safe_load_all(k8s.stdout)}
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (low, high)
    assert objects["Deployment"]["spec"]["replicas"] == low
    chart = tmp_path / "chart"
    helm = cli("deploy", str(plan), "--format", "helm", "--image", image_for("minilm-cpu"), "-o", str(chart), *sizing)
    assert helm.returncode == 0, helm.stderr
    assert _checked_arithmetic(helm.stderr, bench) == (low, high)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    text = json.dumps(values)
    assert f'"minReplicas": {low}' in text and f'"maxReplicas": {high}' in text, text


def test_plan_prints_the_same_range(plan: Path, tmp_path: Path) -> None:
    bench = write(sweep(_profile_id(plan)), tmp_path / "bench")
    shown = cli("plan", "all-minilm-l6-v2", "--gpu", "cpu", "--bench", str(bench), "--tokens-per-day", str(DAY),
                "--slo", "ttft=500ms")
    assert shown.returncode == 0, shown.stderr
    low, high = _checked_arithmetic(shown.stdout, bench)
    assert f"replicas   {low} to {high}" in shown.stdout


@pytest.mark.parametrize(("args", "code", "said"), [
    (["--slo", "ttft=10ms"], 17, "no point of"),  # no point meets it: no count can promise it
    (["--slo", "ttft=500"], 2, "cannot read"),
    (["--slo", "ttft=500ms,ttft=400ms"], 2, "twice"),
    (["--slo", "gpu=5ms"], 2, "not a latency"),
    ([], 2, "--slo missing"),
    (["--slo", "ttft=500ms", "--peak-factor", "nan"], 2, "not a finite number"),  # was a ValueError (exit 70)
])
def test_sizing_input_errors_are_clear(plan: Path, tmp_path: Path, args: list[str], code: int, said: str) -> None:
    bench = write(sweep(_profile_id(plan)), tmp_path / "bench")
    result = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), "--bench", str(bench),
                 "--tokens-per-day", str(DAY), *args)
    assert result.returncode == code and said in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_rate_too_small_to_count_replicas_for_is_refused(plan: Path, tmp_path: Path) -> None:
    # 5e-324 tokens/s (the smallest float) passes the field's bounds; the replicas it needs overflowed (exit 70)
    slow = (point(1, 5e-324, 5e-324, 100.0),)
    bench = write(sweep(_profile_id(plan), points=slow), tmp_path / "bench")
    result = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), "--bench", str(bench),
                 "--tokens-per-day", str(DAY), "--slo", "ttft=500ms")
    assert result.returncode == 2 and "more than the 1000 mbuild writes" in result.stderr, result.stderr


def test_a_fifo_as_the_result_is_refused_not_waited_on(plan: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "bench.json"
    os.mkfifo(fifo)
    result = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), "--bench", str(fifo),
                 "--tokens-per-day", str(DAY), "--slo", "ttft=500ms")
    assert result.returncode == 2 and "is a FIFO, not a regular file" in result.stderr, result.stderr


def test_a_result_of_another_profile_or_with_replicas_given_is_refused(plan: Path, tmp_path: Path) -> None:
    other = write(sweep("f" * 64), tmp_path / "other")
    sizing = ["--tokens-per-day", str(DAY), "--slo", "ttft=500ms"]
    result = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), "--bench", str(other), *sizing)
    assert result.returncode == 2 and "this build is profile" in result.stderr
    mine = write(sweep(_profile_id(plan)), tmp_path / "mine")
    both = cli("deploy", str(plan), "--image", image_for("minilm-cpu"), "--bench", str(mine), *sizing,
               "--max-replicas", "3")
    assert both.returncode == 2 and "give one or the other" in both.stderr


def test_the_slo_point_skips_points_with_errors() -> None:
    result = sweep(points=(point(1, 40.0, 40.0, 100.0), point(4, 130.0, 32.0, 100.0, errors=1)))
    chosen = slo_point(result, parse_slo("ttft=500ms"))
    assert chosen is not None and chosen.concurrency == 1
