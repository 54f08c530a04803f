"""GateReport: the numerical gate's verdict, one type for every task, read by labels, serve, inspect and the CLI.

report.json keeps each gate's own measurements (cosines for encoders, greedy/top-1 agreement for decoders);
this is the part every reader shares, and the one place that phrases it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_FILE = "report.json"


@dataclass(frozen=True)
class GateReport:
    passed: bool
    summary: str
    measurements: dict[str, Any] = field(default_factory=dict)  # the gate's report.json, as written

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GateReport:
        return cls(bool(raw.get("passed")), str(raw.get("summary", "")), dict(raw))

    @classmethod
    def read(cls, path: Path) -> GateReport | None:
        """The report at path; None when there is none or it cannot be read (the engine was never validated)."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cls.from_dict(raw) if isinstance(raw, dict) and "passed" in raw else None

    @property
    def verdict(self) -> str:
        """One line for people: 'passed: <summary>' or 'FAILED: <summary>'."""
        return f"{'passed' if self.passed else 'FAILED'}: {self.summary}".rstrip(": ")

    @property
    def label(self) -> str | None:
        """The image's dev.mbuild.validation label: the verdict and the gate's headline numbers."""
        m = self.measurements
        if "min_cosine" in m:
            return f"passed={self.passed} min_cosine={m['min_cosine']:.6f}"
        if "greedy_equal" in m:
            return (f"passed={self.passed} greedy_equal={m['greedy_equal']}/{len(m['prompts'])} "
                    f"top1={m['top1_agreement']:.4f}")
        return None

    def summary_dict(self) -> dict[str, Any]:
        """What inspect shows and prints as JSON."""
        return {"passed": self.passed, "summary": self.summary, "tolerance": self.measurements.get("tolerance")}
