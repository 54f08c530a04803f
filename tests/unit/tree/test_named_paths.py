"""Every file of this repository that the code, the docs or the templates name by its path (builder/..., tests/...,
docs/...) exists: a module that moved or a page that was renamed leaves no pointer to nowhere behind it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOPS = ("builder", "runtimes", "tests", "bench", "docs", "templates", "profiles", "examples")
SUFFIXES = ("py", "md", "yaml", "yml", "json", "sh", "j2", "jinja", "txt", "toml", "go", "mjs")
NAMED = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOPS)})/[\w./-]*\w\.(?:{'|'.join(SUFFIXES)}))\b")


def texts() -> list[Path]:
    """The repository's own Python (but this file, whose own check names paths that are gone), its pages and its
    templates."""
    code = [p for top in ("builder", "runtimes", "tests", "bench") for p in (ROOT / top).rglob("*.py")
            if p != Path(__file__).resolve()]
    pages = [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")]
    return code + pages + [p for p in (ROOT / "templates").rglob("*") if p.is_file()]


def missing_in(text: str) -> list[str]:
    """The repository paths a text names that resolve to no file or folder."""
    return [path for path in NAMED.findall(text) if not (ROOT / path).exists()]


def test_every_path_the_repository_names_exists() -> None:
    gone = [f"{p.relative_to(ROOT)}:{n}: {path}" for p in texts()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) for path in missing_in(line)]
    assert gone == [], "these name files that do not exist; point them at where the file is now:\n" + "\n".join(gone)


def test_the_scan_sees_a_path_that_is_gone() -> None:
    assert missing_in("see bench/serving.py and builder/model/files.py (tests/unit/test_x.py)") == [
        "bench/serving.py", "tests/unit/test_x.py"]
    assert missing_in("docs/api.md, a/docs/x.md, builder.model.files, templates/Dockerfile.j2") == []
