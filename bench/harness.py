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


def write(name: str, data: dict[str, Any], markdown: str, out: Path = OUT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path = out / f"{name}.md"
    path.write_text(markdown)
    return path
