"""The fast lane's families are records (builder/model/families/, one module each) that the registry finds by
itself, and no module of builder/ or runtimes/ outside them tests a family's name: the graph writer, the MoE
writer, planning and the reranker recipes ask the record."""

from __future__ import annotations

import ast
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from builder.model.families import FAMILIES, WRAPPERS, discover, fast_lane
from builder.model.family_record import Family

ROOT = Path(__file__).resolve().parents[4]
RECORDS = ROOT / "builder" / "model" / "families"
# Strings equal to a family's name that name something else, with how often each file holds one (a new use in the
# same file fails too): the tool-call formats a chat template is detected as (MBUILD_TOOL_CALL_PARSER's values,
# vLLM's --tool-call-parser names) and Dynamo's own parser names. The runtime picks them from the chat template.
OTHER_MEANINGS = {
    ("runtimes/generation/tools.py", "mistral"): 4, ("runtimes/generation/tools.py", "granite"): 4,
    ("runtimes/settings.py", "mistral"): 1, ("runtimes/settings.py", "granite"): 1,
    ("runtimes/dynamo/requests.py", "mistral"): 2, ("runtimes/dynamo/requests.py", "gpt_oss"): 1,
}


def _names_in(path: Path, names: set[str]) -> list[tuple[str, int]]:
    """(name, line) of every string constant in the module that is exactly a family's name."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(((node.value, node.lineno) for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names),
                  key=lambda hit: hit[1])


def test_no_module_outside_the_records_tests_a_family_name() -> None:
    names = set(FAMILIES) | set(WRAPPERS)
    found: list[str] = []
    counts: Counter[tuple[str, str]] = Counter()
    for top in ("builder", "runtimes"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if RECORDS in path.parents:
                continue
            where = path.relative_to(ROOT).as_posix()
            for name, line in _names_in(path, names):
                counts[where, name] += 1
                if (where, name) not in OTHER_MEANINGS:
                    found.append(f"{where}:{line}: {name!r}")
    assert found == [], "a family's name outside builder/model/families/; ask its record instead:\n" + "\n".join(found)
    assert dict(counts) == OTHER_MEANINGS, "a format or parser name that is also a family's is used anew"


def test_the_registry_holds_every_record_module() -> None:
    modules = {p.stem for p in RECORDS.glob("*.py") if p.stem != "__init__"}
    assert modules == set(FAMILIES) | set(WRAPPERS)
    assert not set(FAMILIES) & set(WRAPPERS)
    for name, record in FAMILIES.items():
        assert record.model_type == name and fast_lane(name)
        assert (record.kind == "moe") == (record.experts is not None), name
    assert all(w.text_family in FAMILIES for w in WRAPPERS.values())


def test_a_new_record_module_is_all_a_family_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "more_families"
    shutil.copytree(RECORDS, package, ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    (package / "__init__.py").write_text("")
    (package / "newfam.py").write_text('from builder.model.family_record import Family\n\n'
                                       'RECORD = Family("newfam", "New")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = discover([str(package)], package.name)
        assert set(found) == set(FAMILIES) | set(WRAPPERS) | {"newfam"}
        assert found["newfam"] == Family("newfam", "New")
        (package / "misnamed.py").write_text('from builder.model.family_record import Family\n\n'
                                             'RECORD = Family("other", "Other")\n')
        with pytest.raises(TypeError, match=r"more_families\.misnamed must define RECORD"):
            discover([str(package)], package.name)
    finally:
        for module in [m for m in sys.modules if m.split(".")[0] == package.name]:
            del sys.modules[module]
