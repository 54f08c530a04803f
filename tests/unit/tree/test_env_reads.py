"""Two modules read the environment, runtimes/settings.py in the image and builder/settings.py on the build host,
each variable declared once there, and docs/settings.md's table is written from the declarations: a read elsewhere,
an undeclared variable, a stale table or a declared one that nothing reads fails here; so does a setting parsed
into either settings class that no code reads, or a field that is not exactly one declaration's."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from builder.settings import HOST_VARIABLES, HostSettings
from builder.settings_doc import DOC, settings_page
from runtimes.envparse import Var
from runtimes.settings import IMAGE_VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[3]
READERS = (ROOT / "runtimes" / "settings.py", ROOT / "builder" / "settings.py")
OS_ENV = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
VARIABLE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
TABLE_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)
DECLARED = (*IMAGE_VARIABLES, *HOST_VARIABLES)


def env_accesses(source: str) -> list[int]:
    """Lines that touch the environment: os.environ / os.getenv & co, `from os import environ`, click's envvar=."""
    def touches(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in OS_ENV and isinstance(node.value, ast.Name) and node.value.id == "os"
        if isinstance(node, ast.ImportFrom):
            return node.module == "os" and bool({a.name for a in node.names} & OS_ENV)
        return isinstance(node, ast.keyword) and node.arg in {"envvar", "auto_envvar_prefix"}

    return [getattr(node, "lineno", 0) for node in ast.walk(ast.parse(source)) if touches(node)]


def variable_constants(source: str) -> list[str]:
    """The variable names a settings module holds, as often as it holds each: its string constants shaped like one."""
    return [node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value)]


def flag_names(source: str) -> set[str]:
    """The names code passes to runtimes/settings.py's flag(), which reads one boolean for it."""
    return {node.args[0].value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "flag"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def _sources() -> dict[Path, str]:
    return {path: path.read_text() for package in ("builder", "runtimes") for path in (ROOT / package).rglob("*.py")}


def test_only_the_two_settings_modules_touch_the_environment() -> None:
    strays = [f"{path.relative_to(ROOT)}:{line}" for path, source in _sources().items() if path not in READERS
              for line in env_accesses(source)]
    assert strays == [], "read the environment through runtimes/settings.py or builder/settings.py"


def _flagged() -> set[str]:
    return set().union(*(flag_names(source) for source in _sources().values()))


def test_code_reads_only_declared_variables_and_the_table_lists_each() -> None:
    named = set().union(*(variable_constants(path.read_text()) for path in READERS), _flagged())
    declared = [name for var in DECLARED for name in (var.variable, var.alias) if name]
    assert len(declared) == len(set(declared)), "a variable is declared twice"
    assert sorted(named - set(declared)) == [], "read but not declared in IMAGE_VARIABLES or HOST_VARIABLES"
    documented = TABLE_ROW.findall(DOC.read_text())
    assert documented == declared, "docs/settings.md's table is stale: python -m builder.settings_doc"


def test_docs_settings_table_is_the_written_one() -> None:
    page = DOC.read_text()
    assert page == settings_page(page), "docs/settings.md's table is stale: python -m builder.settings_doc"


def test_a_variable_without_a_field_is_read_by_some_code() -> None:
    """Its declaration names it once; the code that reads it (from_env, a default, flag()) names it again."""
    named = Counter(name for path in READERS for name in variable_constants(path.read_text()))
    named.update(dict.fromkeys(_flagged(), 1))
    unread = [var.variable for var in DECLARED if var.name is None and named[var.variable] < 2]
    assert unread == [], "declared and documented, then read by nothing: read each or remove its declaration"


@pytest.mark.parametrize(("cls", "declared"), [(Settings, IMAGE_VARIABLES), (HostSettings, HOST_VARIABLES)])
def test_every_field_is_one_declared_variable(cls: Any, declared: tuple[Var, ...]) -> None:
    filled = [var.name for var in declared if var.name]
    assert sorted(filled) == sorted(field.name for field in dataclasses.fields(cls))
    assert len(filled) == len(set(filled)), "two variables fill one field"


def attributes_read(source: str) -> set[str]:
    """The attribute names a module reads (`x.name` anywhere but on the left of an assignment)."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store)}


def test_every_setting_is_read_by_some_code() -> None:
    read = set().union(*(attributes_read(source) for source in _sources().values()))
    unread = [f"{cls.__name__}.{f.name}" for cls in (Settings, HostSettings) for f in dataclasses.fields(cls)
              if f.name not in read]
    assert unread == [], "parsed and checked at start, then read by nothing: wire each or remove it"


def test_the_checks_see_what_they_forbid() -> None:
    """The scans above can fail: each way of reading the environment is seen, and a table row is parsed."""
    stray = ("import os\nfrom os import getenv\nimport click\nA = os.environ.get('X')\nB = os.getenv('Y')\n"
             "C = os.environ['Z']\n@click.option('--m', envvar='M')\ndef f(m): pass\n")
    assert sorted(env_accesses(stray)) == [2, 4, 5, 6, 7]
    assert variable_constants("x = env.text('MBUILD_NEW_THING')\ny = 'not one'\n") == ["MBUILD_NEW_THING"]
    assert flag_names("flag('MBUILD_X')\n") == {"MBUILD_X"}
    assert attributes_read("a = settings.port\nsettings.host = 1\n") == {"port"}
    assert TABLE_ROW.findall("| name | side |\n| --- | --- |\n| `MBUILD_A` | image |\n") == ["MBUILD_A"]
