"""docs/architecture.md names every module of builder/ and runtimes/, and no module that is gone.

How the page names a module: under a heading that names `builder/` or `runtimes/`, a code-block line that starts
at column 0 with `pkg/` opens that package's block (indented lines continue it; any other line at column 0 is
the top package's own block; a block names its package's __init__.py). A `.py` token counts for the first of:
the repository root, the current block's package, the section's top package. So `weight_writer.py` in the
`engine/` block, `engine/weight_writer.py` anywhere in the builder section and `builder/engine/weight_writer.py`
anywhere all name the same file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "architecture.md"
TOPS = ("builder", "runtimes")
PY_TOKEN = re.compile(r"(?<![\w./])([\w/]*\w\.py)\b")
BLOCK_HEADER = re.compile(r"^(\w+)/(?:\s|$)")


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for top in TOPS for p in (ROOT / top).rglob("*.py")}


def named(text: str) -> tuple[set[str], list[str]]:
    """The module paths the text names, and the `.py` tokens that resolve to no file."""
    found: set[str] = set()
    missing: list[str] = []
    top: str | None = None
    package: str | None = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            package = top
            continue
        if not in_code and line.startswith("#"):
            top = next((t for t in TOPS if f"{t}/" in line), top)
            package = top
            continue
        if in_code and top and line[:1].strip():
            header = BLOCK_HEADER.match(line)
            package = f"{top}/{header.group(1)}" if header else top
            if header and (ROOT / package / "__init__.py").is_file():
                found.add(f"{package}/__init__.py")  # a package's block is its __init__.py's line
        for token in PY_TOKEN.findall(line):
            candidates = [token] + [f"{base}/{token}" for base in (package, top) if base]
            hit = next((c for c in candidates if (ROOT / c).is_file()), None)
            if hit is None:
                missing.append(f"{token} (in: {line.strip()[:60]})")
            elif hit.split("/")[0] in TOPS:
                found.add(hit)
    return found, missing


def test_every_module_has_a_line_in_the_architecture_doc() -> None:
    found, _ = named(DOC.read_text())
    unnamed = sorted(modules() - found)
    assert unnamed == [], f"add these to docs/architecture.md, in their package's block: {unnamed}"


def test_the_architecture_doc_names_no_module_that_is_gone() -> None:
    _, missing = named(DOC.read_text())
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"


def test_a_module_counts_only_in_its_own_package_block() -> None:
    # `cache.py` is named in builder/engine/'s block; the same name in oci/'s block must not count for it.
    doc = "## builder/\n\n```\noci/   cache.py\nengine/   cache.py\n```\n"
    found, missing = named(doc)
    assert {m for m in found if not m.endswith("__init__.py")} == {"builder/engine/cache.py"}
    assert missing == ["cache.py (in: oci/   cache.py)"]
