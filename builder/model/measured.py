"""The model sweep's record (profiles/model_sweep.json): what each causal-LM type transformers knows did when made
tiny, planned, exported and gated (tests/integration/test_model_sweep.py measures it; docs/models.md shows it).

Planning consults it for one thing: a type the sweep saw refused at its export, for a reason config.json does not
show (a branch on the sequence's length, a layer run twice a step), is refused when planned, before any download,
with the reason measured, where the installed transformers is the one the record was made with: its modeling code
is what was traced. Another transformers, or a type the record does not hold, is tried, and refused at the export
if it is still so. The sweep itself does not consult the record (CONSULTED): it measures.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from builder.resources import resource_dir

RECORD = "model_sweep.json"
CONSULTED = {"on": True}  # the sweep turns it off in its build processes (tests/support/model_sweep.py)


def record_path() -> Path:
    return resource_dir("profiles") / RECORD


def record() -> dict[str, Any]:
    return dict(json.loads(record_path().read_text()))


@cache
def _export_refusals(version: str) -> dict[str, str]:
    try:
        data = record()
    except (OSError, ValueError):  # no record shipped: nothing measured to consult
        return {}
    if data.get("transformers") != version:
        return {}
    return {str(row["model_type"]): str(row["detail"]) for row in data.get("rows", [])
            if row.get("outcome") == "refused" and row.get("stage") == "export"}


def export_refusal(model_type: str, version: str) -> str | None:
    """The reason the sweep measured this type refused at its export, with transformers `version`; else None."""
    if not CONSULTED["on"]:
        return None
    found = _export_refusals(version).get(model_type)
    return f"{found} (measured at its export by mbuild's model sweep)" if found else None
