"""The physical split is the architecture: runtimes never imports builder; only the CLI imports the CLI; builder's
packages and runtimes' layers import only downward."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


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
COMMON = "common"  # builder/*.py: errors, hashing, resources, progress ...; below everything
LAYERS = ("cli", "benchmark", "serving", "build", "deploy", "image", "engine", "planning", "model", "oci", COMMON)

# runtimes/'s layers, top to bottom, and where each top-level module or package sits: the container's processes;
# HTTP; what the service holds (it puts the engines, generation and the batcher together); the text-generation
# runtime; the engines; then the shared modules any layer may use, which import only each other.
RUNTIME_LAYERS = ("process", "api", "state", "generation", "engines", "shared")
RUNTIME_PLACES = {
    "__main__": "process", "supervisor": "process", "server": "process", "service": "process", "healthcheck": "process",
    "dynamo": "process",  # the image as a Dynamo worker: another way the container runs
    "api": "api", "state": "state", "generation": "generation", "engines": "engines",
    **dict.fromkeys(("settings", "bundle", "metrics", "health", "encoder_batcher", "tokenize", "hardware", "fit",
                     "exits", "ids", "logs", "envparse", "kernels", "startup"), "shared"),
}


def builder_layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else COMMON


def runtime_layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "shared"  # runtimes/__init__.py: the version
    return RUNTIME_PLACES.get(parts[1], "unplaced")


def upward_imports(package: str, order: tuple[str, ...], layer: Callable[[str], str]) -> list[str]:
    """Imports inside `package` that go up `order` (top first), and modules that sit in no layer of it."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        here = layer(module)
        if here not in order:
            found.append(f"{module} is in none of the layers {order}: add it to the rule")
            continue
        for name in sorted(imported_modules(path)):
            there = layer(name)
            if name.split(".")[0] == package and there in order and order.index(there) < order.index(here):
                found.append(f"{module} ({here}) imports {name} ({there})")
    return found


def test_builder_packages_import_only_downward() -> None:
    assert upward_imports("builder", LAYERS, builder_layer) == []


def test_runtimes_layers_import_only_downward() -> None:
    """api -> state -> generation -> engines -> the shared modules; nothing below api imports it."""
    assert upward_imports("runtimes", RUNTIME_LAYERS, runtime_layer) == []


def test_the_layer_rules_see_an_upward_import() -> None:
    """The checks above can fail: a planning module importing the pipeline, or generation importing api."""
    assert LAYERS.index(builder_layer("builder.build.pipeline")) < LAYERS.index(builder_layer("builder.planning.plan"))
    assert builder_layer("builder.errors") == COMMON and builder_layer("builder.oci.layout") == "oci"
    order = [RUNTIME_LAYERS.index(runtime_layer(m)) for m in
             ("runtimes.api.errors", "runtimes.state", "runtimes.generation.sampling", "runtimes.engines.decoder",
              "runtimes.settings", "runtimes")]
    assert order == sorted(order) and len(set(order)) == 5
    assert runtime_layer("runtimes.newcomer") not in RUNTIME_LAYERS


def test_planning_loads_without_the_hub_client_or_torch_or_onnx() -> None:
    blocked = ("huggingface_hub", "torch", "transformers", "onnx", "onnxruntime", "tensorrt")
    folder = ROOT / "builder" / "planning"
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in folder.glob("*.py")]
    code = (f"import sys, importlib\nfor name in {blocked!r}: sys.modules[name] = None\n"
            f"for module in {modules!r}: importlib.import_module(module)\nprint('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
