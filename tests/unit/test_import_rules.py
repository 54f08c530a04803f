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


# builder/'s packages, top to bottom: each imports only its own package and those below it (docs/architecture.md).
LAYERS = ("cli", "build", "deploy", "image", "engine", "planning", "model", "oci")
COMMON = "common"  # builder/*.py: errors, hashing, resources, progress ...; below everything


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else COMMON


def _rank(layer: str) -> int:
    return len(LAYERS) - LAYERS.index(layer) if layer in LAYERS else 0


def upward_imports() -> list[str]:
    found = []
    for path in sorted((ROOT / "builder").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        here = _layer(module)
        for name in imported_modules(path):
            if name.startswith("builder.") and _rank(_layer(name)) > _rank(here):
                found.append(f"{module} ({here}) imports {name} ({_layer(name)})")
    return found


def test_builder_packages_import_only_downward() -> None:
    assert upward_imports() == []


def test_the_layer_rule_sees_an_upward_import() -> None:
    """The check above can fail: a planning module importing the pipeline is flagged."""
    assert _rank(_layer("builder.build.pipeline")) > _rank(_layer("builder.planning.plan"))
    assert _layer("builder.errors") == COMMON and _layer("builder.oci.layout") == "oci"


def test_planning_loads_without_the_hub_client_or_torch_or_onnx() -> None:
    blocked = ("huggingface_hub", "torch", "transformers", "onnx", "onnxruntime", "tensorrt")
    folder = ROOT / "builder" / "planning"
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in folder.glob("*.py")]
    code = (f"import sys, importlib\nfor name in {blocked!r}: sys.modules[name] = None\n"
            f"for module in {modules!r}: importlib.import_module(module)\nprint('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
