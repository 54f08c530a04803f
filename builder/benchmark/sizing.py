"""Replicas for a token volume, from a measured sweep: `mbuild plan`/`deploy --tokens-per-day N --slo ... --bench`.

The arithmetic, shown to the user as it is done: one replica delivers the tokens/s of the sweep's highest point that
meets the SLO; the day's mean rate needs ceil(mean / that) replicas (the autoscaler's floor) and its peak, the
mean times --peak-factor, ceil(peak / that) (its ceiling)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from builder.benchmark.result import BenchResult, Point, Slo, parse_slo, read_result, slo_point
from builder.errors import InputError, SloUnmet

SECONDS_A_DAY = 86_400
MAX_REPLICAS = 1000  # `mbuild deploy --max-replicas`'s bound


@dataclass(frozen=True)
class Sizing:
    tokens_per_day: int
    peak_factor: float
    slo: Slo
    point: Point
    unit: str
    source: str

    @property
    def mean_rate(self) -> float:
        return self.tokens_per_day / SECONDS_A_DAY

    @property
    def min_replicas(self) -> int:
        return max(1, math.ceil(self.mean_rate / self.point.tokens_per_s))

    @property
    def max_replicas(self) -> int:
        return max(self.min_replicas, math.ceil(self.mean_rate * self.peak_factor / self.point.tokens_per_s))

    def lines(self) -> list[str]:
        per = self.point.tokens_per_s
        peak = self.mean_rate * self.peak_factor
        return [
            f"measured: {self.source}; at concurrency {self.point.concurrency}, the highest point meeting "
            f"{self.slo.describe()}, one replica serves {per:.1f} {self.unit}/s",
            f"mean: {self.tokens_per_day} {self.unit}/day / {SECONDS_A_DAY} s = {self.mean_rate:.1f}/s -> "
            f"ceil({self.mean_rate:.1f} / {per:.1f}) = {self.min_replicas} replica(s) (min)",
            f"peak: {self.mean_rate:.1f}/s x peak factor {self.peak_factor:g} = {peak:.1f}/s -> "
            f"ceil({peak:.1f} / {per:.1f}) = {self.max_replicas} replica(s) (max)",
        ]


def size(result: BenchResult, tokens_per_day: int, slo: Slo, peak_factor: float, source: str) -> Sizing:
    point = slo_point(result, slo)
    if point is None or point.tokens_per_s <= 0:
        raise SloUnmet(f"no point of {source} meets {slo.describe()}, so no replica count can promise it",
                       hint="bench lower concurrencies (--concurrency 1,2), loosen --slo, or pick a faster profile")
    sizing = Sizing(tokens_per_day, peak_factor, slo, point, result.measured.unit, source)
    needed = sizing.mean_rate * peak_factor / point.tokens_per_s  # before ceil: a rate of 5e-324 makes it infinite
    if not needed <= MAX_REPLICAS:
        count = f"{math.ceil(needed)} replicas" if math.isfinite(needed) else "more replicas than can be counted"
        raise InputError(f"{tokens_per_day} {result.measured.unit}/day needs {count} at peak "
                         f"({point.tokens_per_s:.4g} {result.measured.unit}/s each), more than the {MAX_REPLICAS} "
                         "mbuild writes", hint="split the traffic across deployments, or bench again if that rate "
                                               "is not what a replica serves")
    return sizing


def sizing_from_options(bench: Path | None, tokens_per_day: int | None, slo: str | None, percentile: int,
                        peak_factor: float, profile_id: str | None) -> Sizing | None:
    """The CLI's options taken together: all of them or none; a result measured on another profile is refused."""
    given = {"--bench": bench, "--tokens-per-day": tokens_per_day, "--slo": slo}
    if all(v is None for v in given.values()):
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise InputError(f"sizing needs {', '.join(given)} together; {', '.join(missing)} missing",
                         hint="e.g. --bench out/bench.json --tokens-per-day 500000000 --slo ttft=500ms")
    assert bench is not None and tokens_per_day is not None and slo is not None
    result = read_result(bench)
    measured = result.measured.profile_id
    if profile_id and measured and measured != profile_id:
        raise InputError(f"{bench} measured profile {result.measured.profile} ({measured[:12]}); this build is "
                         f"profile {profile_id[:12]}", hint="bench a build of this profile, or size with its result")
    return size(result, tokens_per_day, parse_slo(slo, percentile), peak_factor, str(bench))
