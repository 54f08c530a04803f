"""bench.json's contract: what one `mbuild bench` measured, point by point, and what follows from it (the
frontier, the highest load meeting an SLO, cost per million tokens). `mbuild plan` and `deploy` size replicas from
this file, so it is read only through decode: a hand-edited or foreign file is refused by field, never trusted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builder.errors import InputError
from builder.safepaths import read_regular
from runtimes.bundle.codec import ContractError, bounds, check_format, decode, encode

RESULT_FILE = "bench.json"
RESULT_FORMAT = 1
MAX_RESULT_BYTES = 16 << 20
MAX_TEXT = 4096  # characters in one of its strings (a target's path, a price's source)
PERCENTILES = (50, 90, 99)
SLO_METRICS = {"ttft": "time to first token", "tpot": "time per output token", "itl": "inter-token latency",
               "latency": "request latency"}
_MS = bounds(0, 3.6e6)  # an hour, in milliseconds
Unit = Literal["output tokens", "input tokens"]


@dataclass(frozen=True)
class Spread:
    """One latency over a point's requests, in milliseconds, as AIPerf reports it."""

    mean: float = field(metadata=_MS)
    p50: float = field(metadata=_MS)
    p90: float = field(metadata=_MS)
    p99: float = field(metadata=_MS)

    def at(self, percentile: int) -> float:
        return {50: self.p50, 90: self.p90, 99: self.p99}[percentile]


@dataclass(frozen=True)
class Point:
    concurrency: int = field(metadata=bounds(1, 100_000))
    requests: int = field(metadata=bounds(0, 10**9))  # completed without error
    errors: int = field(metadata=bounds(0, 10**9))
    duration_s: float = field(metadata=bounds(0, 10**7))
    request_rate: float = field(metadata=bounds(0, 10**9))  # requests/s
    tokens_per_s: float = field(metadata=bounds(0, 10**12))  # the result's unit (output, or input for embedders)
    per_user_tokens_per_s: float = field(metadata=bounds(0, 10**12))
    latency: Spread  # request latency
    ttft: Spread | None = None  # streaming language models only
    tpot: Spread | None = None  # AIPerf's inter_token_latency: (latency - ttft) / (output tokens - 1)
    itl: Spread | None = None  # AIPerf's inter_chunk_latency: between streamed chunks
    energy_j: float | None = field(default=None, metadata=bounds(0, 10**12))

    def spread(self, metric: str) -> Spread | None:
        return {"ttft": self.ttft, "tpot": self.tpot, "itl": self.itl, "latency": self.latency}[metric]

    @property
    def joules_per_token(self) -> float | None:
        tokens = self.tokens_per_s * self.duration_s
        return self.energy_j / tokens if self.energy_j is not None and tokens > 0 else None


@dataclass(frozen=True)
class Measured:
    """What was measured: the target as it said it is, and the workload."""

    kind: str  # build | image | url
    target: str
    model: str  # the served name
    task: str
    profile_id: str  # "" where the server did not say (not mbuild's)
    profile: str
    cores: int | None  # the replica's cores, where they are known
    workload: str
    endpoint: str  # AIPerf's endpoint type
    isl: int = field(metadata=bounds(0, 10**7))
    osl: int = field(metadata=bounds(0, 10**7))
    unit: Unit  # what tokens_per_s counts
    tool: str  # the load generator and its version


@dataclass(frozen=True)
class Price:
    per_hour: float = field(metadata=bounds(0, 10**6))  # one replica, in US dollars
    source: str


@dataclass(frozen=True)
class BenchResult:
    measured: Measured
    points: tuple[Point, ...]
    price: Price | None
    energy: str  # how energy was read, or why it was not
    format: int = RESULT_FORMAT

    def to_json(self) -> str:
        return json.dumps(encode(self), indent=2, sort_keys=True) + "\n"

    def cost_per_million(self, point: Point) -> float | None:
        if self.price is None or point.tokens_per_s <= 0:
            return None
        return self.price.per_hour / (point.tokens_per_s * 3600) * 1e6


def read_result(path: Path) -> BenchResult:
    """A bench.json (or the folder holding one), refused by field when it is not this format."""
    file = path / RESULT_FILE if path.is_dir() else path
    hint = "give the bench.json (or its folder) that `mbuild bench` wrote"
    data = read_regular(file, MAX_RESULT_BYTES, "the bench result", hint)
    try:
        raw = json.loads(data.decode(errors="replace"))
        check_format(raw, str(file), RESULT_FORMAT)
        result = decode(BenchResult, raw, str(file))
    except (ValueError, ContractError, RecursionError) as exc:  # RecursionError: JSON nested past Python's stack
        shown = "it is nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise InputError(f"{file} is not a bench result of this mbuild: {shown}",
                         hint="run `mbuild bench` again to write one") from exc
    _check_text(result, file)
    return result


def _check_text(result: BenchResult, file: Path) -> None:
    """Its words are printed (the profile in a refusal): none may move the cursor, colour, break a line or reorder
    text (control and format characters); none is longer than a path."""
    for value in _strings(encode(result)):
        if len(value) > MAX_TEXT or not value.isprintable():
            shown = ascii(value[:40]) + ("..." if len(value) > 40 else "")
            raise InputError(f"{file} is not a bench result of this mbuild: {shown} is over {MAX_TEXT} characters "
                             "or holds one that is not printable", hint="run `mbuild bench` again to write one")


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@dataclass(frozen=True)
class Slo:
    """Upper bounds, in milliseconds, on a latency's percentile."""

    limits: tuple[tuple[str, float], ...]
    percentile: int = 90

    def describe(self) -> str:
        return ", ".join(f"p{self.percentile} {name} <= {value:g} ms" for name, value in self.limits)

    def misses(self, point: Point) -> list[str]:
        """What the point misses; a bound on a latency the point lacks (TTFT of an embedder) is a miss too."""
        found = []
        for name, limit in self.limits:
            spread = point.spread(name)
            if spread is None:
                found.append(f"no {SLO_METRICS[name]} measured")
            elif spread.at(self.percentile) > limit:
                found.append(f"p{self.percentile} {name} {spread.at(self.percentile):.1f} ms > {limit:g} ms")
        return found


_BOUND = re.compile(r"\s*([a-z]+)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s)\s*")


def parse_slo(text: str, percentile: int = 90) -> Slo:
    """`ttft=500ms,tpot=50ms`: each bound once, a number with its unit."""
    hint = f"write it as ttft=500ms,tpot=50ms; the latencies are {', '.join(SLO_METRICS)}"
    if len(text) > 200:
        raise InputError(f"--slo is {len(text)} characters long", hint=hint)
    limits: dict[str, float] = {}
    for part in text.split(","):
        found = _BOUND.fullmatch(part)
        if found is None:
            raise InputError(f"--slo {text!r}: cannot read {part.strip()!r}", hint=hint)
        name, value, unit = found.groups()
        if name not in SLO_METRICS:
            raise InputError(f"--slo {text!r}: {name!r} is not a latency mbuild measures", hint=hint)
        if name in limits:
            raise InputError(f"--slo {text!r} bounds {name} twice", hint=hint)
        ms = float(value) * (1000 if unit == "s" else 1)
        if not 0 < ms <= 3.6e6:
            raise InputError(f"--slo {text!r}: {name} must be above 0 and at most an hour", hint=hint)
        limits[name] = ms
    return Slo(tuple(limits.items()), percentile)


def frontier(points: tuple[Point, ...]) -> list[Point]:
    """The Pareto frontier of tokens/s per replica against tokens/s per user: the points no other point beats on
    both, by throughput."""
    kept = [p for p in points if p.requests > 0 and not any(
        q.tokens_per_s >= p.tokens_per_s and q.per_user_tokens_per_s >= p.per_user_tokens_per_s
        and (q.tokens_per_s, q.per_user_tokens_per_s) != (p.tokens_per_s, p.per_user_tokens_per_s)
        for q in points if q.requests > 0)]
    return sorted(kept, key=lambda p: p.tokens_per_s)


def slo_point(result: BenchResult, slo: Slo) -> Point | None:
    """The highest-throughput point without errors that meets every bound."""
    meeting = [p for p in result.points if p.requests > 0 and p.errors == 0 and not slo.misses(p)]
    return max(meeting, key=lambda p: p.tokens_per_s, default=None)
