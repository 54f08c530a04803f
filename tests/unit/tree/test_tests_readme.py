"""tests/README.md's map of which tests cover which package is the one tests/support/readme_map.py writes from the
tree, so a new test (or a moved one) is in the map when it is written, in the folder of the package it tests."""

from __future__ import annotations

from pathlib import Path

from tests.support.readme_map import README, TESTS, render, rewritten


def test_the_readme_map_is_written_from_the_tree() -> None:
    assert list((TESTS / "unit").rglob("test_*.py")), "no test files found: the folders moved"
    assert README.read_text() == rewritten(README.read_text()), \
        "tests/README.md's map is stale: run `python -m tests.support.readme_map`"


def test_every_unit_test_lies_in_a_folder_that_mirrors_a_package() -> None:
    root = TESTS.parent
    strays = [path.relative_to(TESTS).as_posix() for path in (TESTS / "unit").rglob("test_*.py")
              if (folder := path.parent.relative_to(TESTS / "unit")).as_posix() != "tree"
              and not (root / folder).is_dir()]
    assert strays == [], "put each in tests/unit/<the package it tests>/ (builder/..., runtimes/..., bench/)"


def test_the_map_names_every_test_file() -> None:
    written = render()
    for tier in ("unit", "integration", "gpu"):
        for path in (TESTS / tier).rglob("test_*.py"):
            assert f"`{path.relative_to(TESTS).as_posix()}`" in written, path
    assert Path(__file__).stem in written
