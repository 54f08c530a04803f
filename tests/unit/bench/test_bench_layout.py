"""bench/'s layout: every module in bench/scenarios/ is a `python -m bench` scenario, none imports another (what they
share lives in bench/lib/), and the CLI lists exactly those scenarios, each with its one-line description."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"
SCENARIOS = sorted(p.stem for p in (BENCH / "scenarios").glob("*.py") if p.stem != "__init__")


def imported(path: Path) -> set[str]:
    """Every module `path` imports, as dotted names (`from a import b` gives a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def scenario_imports(path: Path) -> set[str]:
    return {name for name in imported(path) if name == "bench.scenarios" or name.startswith("bench.scenarios.")}


@pytest.fixture(scope="module")
def help_text() -> str:
    shown = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def listed(help_text: str) -> dict[str, str]:
    """The scenarios `--help` lists after its "scenarios:" line: name -> description."""
    rows = help_text.split("\nscenarios:\n", 1)[1].splitlines()
    return {name: line.strip() for name, _, line in (row.strip().partition(" ") for row in rows if row.strip())}


def test_there_are_scenarios_and_shared_code_lives_in_lib() -> None:
    assert {"embeddings", "llm_served", "builds", "llm_peer", "build_scale"} <= set(SCENARIOS)
    assert not [p.name for p in BENCH.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}], \
        "bench/ holds only the CLI: scenarios in bench/scenarios/, shared code in bench/lib/, apps in bench/peers/"


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_imports_no_other_scenario(name: str) -> None:
    assert not scenario_imports(BENCH / "scenarios" / f"{name}.py"), "move what scenarios share into bench/lib/"


@pytest.mark.parametrize("path", sorted((BENCH / "lib").glob("*.py")) + sorted((BENCH / "peers").glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_lib_and_peers_import_no_scenario(path: Path) -> None:
    assert not scenario_imports(path)


def test_the_import_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    for line in ("from bench.scenarios.serving import SENTENCE", "from bench.scenarios import llm",
                 "import bench.scenarios.llm_peer"):
        (tmp_path / "bad.py").write_text(f'"""A scenario."""\n\n{line}\n')
        assert scenario_imports(tmp_path / "bad.py"), line


def test_help_lists_every_scenario_with_its_docstring_line(help_text: str) -> None:
    shown = listed(help_text)
    assert sorted(shown) == SCENARIOS  # none missing, none that is not a module
    for name, line in shown.items():
        doc = ast.get_docstring(ast.parse((BENCH / "scenarios" / f"{name}.py").read_text())) or ""
        assert line == doc.strip().splitlines()[0], name
        assert line.endswith((".", "?")), f"{name}: its docstring's first line is not a whole sentence"
    assert "--quick" in help_text


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_takes_quick_and_a_report_folder(name: str) -> None:
    """`python -m bench all --quick` calls main(repeats=1, quick=True, out=...) on each."""
    tree = ast.parse((BENCH / "scenarios" / f"{name}.py").read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    params = {arg.arg for arg in [*main.args.args, *main.args.kwonlyargs]}
    assert {"repeats", "quick", "out"} <= params


def test_the_published_set_and_the_docs_name_existing_scenarios() -> None:
    from bench.__main__ import PUBLISHED

    assert set(PUBLISHED) <= set(SCENARIOS)
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "profiles").glob("*.yaml")]
    named = {(path.name, match) for path in texts if path.is_file()
             for match in re.findall(r"python -m bench ([a-z_0-9]+)", path.read_text())}
    assert named
    assert not {(file, name) for file, name in named if name not in {*SCENARIOS, "all", "index"}}


def test_an_unknown_scenario_is_refused_with_the_choices() -> None:
    shown = subprocess.run([sys.executable, "-m", "bench", "no_such_scenario"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 2
    assert "invalid choice" in shown.stderr and "embeddings" in shown.stderr
