"""The builder's reading of report.json, the numerical gate's verdict (labels, serve, inspect, deploy, the CLI).

The contract itself is runtimes.bundle.report's, since the image reads the file too; here a report of another
format, or an ill-typed one, becomes an InputError that says to rebuild.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.errors import InputError
from runtimes.bundle.codec import ContractError, encode
from runtimes.bundle.report import REPORT_FILE, DecoderReport, EncoderReport, GateReport, read_gate_report, verdict

__all__ = ["REPORT_FILE", "DecoderReport", "EncoderReport", "GateReport", "read_report", "require_report",
           "summary_dict", "verdict"]


def read_report(path: Path) -> GateReport | None:
    """The report at path; None when there is none (the engine was never validated)."""
    if not path.is_file():
        return None
    return require_report(path)


def require_report(path: Path) -> GateReport:
    try:
        return read_gate_report(json.loads(path.read_text()))
    except (OSError, ValueError, ContractError) as exc:
        raise InputError(f"{path} is not a readable gate report: {exc}",
                         hint="build it again with this mbuild (`mbuild package`); a build folder of another "
                              "mbuild version is not read") from exc


def summary_dict(report: GateReport) -> dict[str, Any]:
    """What inspect shows and prints as JSON."""
    return {"passed": report.passed, "summary": report.summary, "tolerance": encode(report.tolerance)}
