"""Repeats with interleaved arms, medians with their spread, and the files a run writes."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@dataclass
class Series:
    """Repeated measurements of one arm in one case (higher is better unless stated)."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def spread(self, digits: int = 1) -> str:
        return f"{min(self.values):.{digits}f}-{max(self.values):.{digits}f}" if self.values else "-"


def interleave(cases: list[tuple[str, Callable[[], float]]], repeats: int,
               log: Callable[[str], None] = print) -> dict[str, Series]:
    """Run every case once per round, rounds `repeats` times, so drift hits all arms alike."""
    results = {name: Series() for name, _ in cases}
    for round_ in range(repeats):
        for name, run in cases:
            started = time.perf_counter()
            value = run()
            results[name].values.append(value)
            log(f"  round {round_ + 1}/{repeats} {name}: {value:.2f} ({time.perf_counter() - started:.1f}s)")
    return results


def machine() -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def read_rate_gbs(size: int = 1 << 30, repeats: int = 5) -> float:
    """One core's sequential read rate in GB/s: the best of `repeats` numpy maxima over `size` bytes, on the calling
    thread's cores (a maximum streams faster than a sum here). No step that must read N bytes takes less than N over
    this; the best of several keeps that floor low on a machine whose bandwidth varies between runs."""
    data = np.ones(size // 4, np.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        data.max()
        best = min(best, time.perf_counter() - started)
    return size / best / 1e9


def write(name: str, data: dict[str, Any], markdown: str, out: Path = OUT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path = out / f"{name}.md"
    path.write_text(markdown)
    return path
