"""Bench results for the sizing and analysis tests, written through bench.json's contract. The numbers are the
test's own choice (a sweep whose shape the test controls: throughput rising with load, latency with it); what the
tests check is the arithmetic and the files that follow from them, not a measurement."""

from __future__ import annotations

from pathlib import Path

from builder.benchmark.result import RESULT_FILE, BenchResult, Measured, Point, Price, Spread


def spread(p50: float) -> Spread:
    return Spread(mean=p50 * 1.1, p50=p50, p90=p50 * 1.5, p99=p50 * 2)


def point(concurrency: int, tokens: float, per_user: float, ttft_p50: float, errors: int = 0) -> Point:
    return Point(concurrency=concurrency, requests=16, errors=errors, duration_s=10.0, request_rate=tokens / 100,
                 tokens_per_s=tokens, per_user_tokens_per_s=per_user, latency=spread(ttft_p50 * 4),
                 ttft=spread(ttft_p50), tpot=spread(20.0), itl=spread(20.0))


def sweep(profile_id: str = "", profile: str = "onnxruntime-cpu-fp32-tp1-latency",
          points: tuple[Point, ...] | None = None, price: float | None = 0.1) -> BenchResult:
    measured = Measured(kind="build", target="build", model="m", task="text-generation", profile_id=profile_id,
                        profile=profile, cores=2, workload="chat", endpoint="chat", isl=1024, osl=1024,
                        unit="output tokens", tool="aiperf 0.13.0")
    chosen = points or (point(1, 40.0, 40.0, 100.0), point(4, 130.0, 32.0, 200.0), point(16, 300.0, 19.0, 450.0),
                        point(64, 420.0, 7.0, 1500.0))
    return BenchResult(measured, chosen, Price(price, "test") if price is not None else None, "not read: test")


def write(result: BenchResult, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESULT_FILE
    path.write_text(result.to_json())
    return path
