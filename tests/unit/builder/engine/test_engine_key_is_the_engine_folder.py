"""The engine cache is keyed by builder/engine/: editing code outside it reuses the engine, inside rebuilds it.

Runs the real pipeline from a temporary copy of the source tree, so the edits never touch the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _copy_tree(dest: Path) -> Path:
    for name in ("builder", "runtimes", "templates", "profiles"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _package(tree: Path, model: Path, out: Path, engines: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "MBUILD_ENGINE_CACHE": str(engines)}
    result = subprocess.run([sys.executable, "-m", "builder.cli", "package", str(model), "--backend", "none",
                             "--output", str(out)], capture_output=True, text=True, cwd=tree, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an edit that changes this file's bytes\n")


def test_edits_outside_builder_engine_reuse_the_engine_and_inside_rebuild_it(tiny_encoder: Path,
                                                                            tmp_path: Path) -> None:
    tree, engines = _copy_tree(tmp_path / "src"), tmp_path / "engines"
    first = _package(tree, tiny_encoder, tmp_path / "a", engines)
    assert "reused the validated engine" not in first and "export" in first

    for outside in ("builder/image/dockerfile.py", "builder/build/pipeline.py", "builder/planning/selection.py"):
        _edit(tree / outside)
    second = _package(tree, tiny_encoder, tmp_path / "b", engines)
    assert "reused the validated engine" in second

    _edit(tree / "builder" / "engine" / "compile_ort.py")
    third = _package(tree, tiny_encoder, tmp_path / "c", engines)
    assert "reused the validated engine" not in third
    assert (tmp_path / "c" / "model" / "model.onnx").is_file()
