"""Two modules read the environment, runtimes/settings.py in the image and builder/settings.py on the build host,
and docs/settings.md lists exactly the variables they read: a read elsewhere, an undocumented variable or a
documented one that nothing reads fails here; so does a setting parsed into either settings class that no code
reads."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from builder.settings import HostSettings
from runtimes.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
READERS = (ROOT / "runtimes" / "settings.py", ROOT / "builder" / "settings.py")
OS_ENV = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
VARIABLE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
TABLE_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)


def env_accesses(source: str) -> list[int]:
    """Lines that touch the environment: os.environ / os.getenv & co, `from os import environ`, click's envvar=."""
    def touches(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in OS_ENV and isinstance(node.value, ast.Name) and node.value.id == "os"
        if isinstance(node, ast.ImportFrom):
            return node.module == "os" and bool({a.name for a in node.names} & OS_ENV)
        return isinstance(node, ast.keyword) and node.arg in {"envvar", "auto_envvar_prefix"}

    return [getattr(node, "lineno", 0) for node in ast.walk(ast.parse(source)) if touches(node)]


def variables_named(source: str) -> set[str]:
    """The variable names a settings module reads: its string constants shaped like one."""
    return {node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value)}


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


def test_docs_settings_lists_exactly_the_variables_read() -> None:
    read = set().union(*(variables_named(path.read_text()) for path in READERS),
                       *(flag_names(source) for source in _sources().values()))
    documented = TABLE_ROW.findall((ROOT / "docs" / "settings.md").read_text())
    assert len(documented) == len(set(documented)), "a variable is listed twice in docs/settings.md"
    assert sorted(read - set(documented)) == [], "read but missing from docs/settings.md's table"
    assert sorted(set(documented) - read) == [], "in docs/settings.md's table but read by no code"


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
    assert variables_named("x = env.text('MBUILD_NEW_THING')\ny = 'not one'\n") == {"MBUILD_NEW_THING"}
    assert flag_names("flag('MBUILD_X')\n") == {"MBUILD_X"}
    assert attributes_read("a = settings.port\nsettings.host = 1\n") == {"port"}
    assert TABLE_ROW.findall("| name | side |\n| --- | --- |\n| `MBUILD_A` | image |\n") == ["MBUILD_A"]
