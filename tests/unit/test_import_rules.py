"""The physical split is the architecture: runtimes never imports builder; only the CLI imports the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def offenders(package: str, forbidden: str, skip: str | None = None) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if skip and skip in path.parts:
            continue
        bad = [m for m in imported_modules(path) if m == forbidden or m.startswith(forbidden + ".")]
        found += [f"{path.relative_to(ROOT)} imports {m}" for m in bad]
    return found


def test_runtimes_never_imports_builder() -> None:
    assert offenders("runtimes", "builder") == []


def test_builder_internals_never_import_the_cli() -> None:
    assert offenders("builder", "builder.cli", skip="cli") == []


def test_runtime_service_imports_with_builder_unavailable() -> None:
    # sys.modules[name] = None makes any import of it fail, as in the image where builder is absent.
    code = ("import sys; sys.modules['builder'] = None; sys.modules['torch'] = None; "
            "sys.modules['transformers'] = None; import runtimes.service, runtimes.__main__; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={"MBUILD_MODEL_DIR": "/nonexistent", "PATH": "/usr/bin:/bin",
                                 "BENTOML_HOME": "/tmp/bentoml-import-test", "BENTOML_DO_NOT_TRACK": "true"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
