"""tests/README.md's map of which tests cover which package, written from the tree, never by hand:
`python -m tests.support.readme_map` rewrites it; tests/unit/tree/test_tests_readme.py fails when it is stale.

tests/unit/ mirrors the packages (tests/unit/builder/engine/ tests builder/engine/, tests/unit/runtimes/ the
runtime's shared modules, tests/unit/tree/ the rules over the whole tree), so a unit test's folder is its package;
an integration or GPU test is listed by what its docstring says it covers.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
README = TESTS / "README.md"
BEGIN = "<!-- the map below is written by `python -m tests.support.readme_map`: do not edit it by hand -->"
END = "<!-- end of the written map -->"
TIERS = ("integration", "gpu")
WHOLE_TREE = "tree"  # tests/unit/tree/: the rules over every package at once


def summary(path: Path) -> str:
    """The docstring's first sentence, on one line, with any table bar escaped."""
    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = " ".join(text.split("\n\n")[0].split())
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", line, maxsplit=1)[0]
    return first.replace("|", "\\|")


def package_of(folder: Path) -> str:
    """What a folder of tests/unit/ mirrors."""
    relative = folder.relative_to(TESTS / "unit").as_posix()
    if relative == WHOLE_TREE:
        return "the whole tree"
    top = relative.split("/")[0]
    return f"`{relative}/`" + (" (its top-level modules)" if relative == top and top != "bench" else "")


def render() -> str:
    rows = ["| package | unit tests (`tests/unit/` + the package's path) |", "| --- | --- |"]
    files = ["| test file | what it checks |", "| --- | --- |"]
    for folder in sorted({path.parent for path in (TESTS / "unit").rglob("test_*.py")}):
        tests = sorted(folder.glob("test_*.py"))
        rows.append(f"| {package_of(folder)} | {', '.join(path.stem for path in tests)} |")
        files += [f"| `{path.relative_to(TESTS).as_posix()}` | {summary(path)} |" for path in tests]
    for tier in TIERS:
        files += [f"| `{path.relative_to(TESTS).as_posix()}` | {summary(path)} |"
                  for path in sorted((TESTS / tier).glob("test_*.py"))]
    return "\n".join([BEGIN, "", *rows, "", *files, "", END])


def rewritten(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + render() + text[end:]


if __name__ == "__main__":
    README.write_text(rewritten(README.read_text()))
    sys.stdout.write(f"wrote {README}\n")
