"""tests/README.md's table of which tests cover which module names every test file, so a new test is placed in the
map when it is written (the table was generated once; this keeps it whole)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_is_named_in_the_readme() -> None:
    named = set(re.findall(r"\btest_\w+", (TESTS / "README.md").read_text()))
    files = {path.stem for folder in ("unit", "integration", "gpu") for path in (TESTS / folder).glob("test_*.py")}
    assert files, "no test files found: the folders moved"
    missing = sorted(files - named)
    assert not missing, f"add these to tests/README.md's table, in the row of the module each tests: {missing}"
