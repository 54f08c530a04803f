"""Golden files: compare, or rewrite them with MBUILD_UPDATE_GOLDEN=1 (then review the diff)."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MBUILD_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"golden file {path} is missing; run with MBUILD_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"output differs from {path}; rerun with MBUILD_UPDATE_GOLDEN=1 if intended"
