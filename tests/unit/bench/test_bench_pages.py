"""docs/benchmarks/: every page starts with its header (what it measures, machine, date, commit, command), a run writes
that header, and the README's table is exactly what `python -m bench index` makes from the headers."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib import index, page_header
from bench.lib.harness import machine, write
from bench.lib.page_header import FIELDS, Header, HeaderError, read

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "benchmarks"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != index.README)
SCENARIOS = ROOT / "bench" / "scenarios"
SHA = re.compile(r"[0-9a-f]{7,}(-dirty)?")


def run_record(page: Path) -> dict[str, object] | None:
    """The run record in a page's .json (build_scale's: its newest shape's), None for a hand-written page."""
    record = page.with_suffix(".json")
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    if "machine" in data:
        return dict(data["machine"])
    return dict(max((shape["machine"] for shape in data["shapes"].values()), key=lambda m: m["date"]))


def measures_constant(scenario: str) -> object:
    """A scenario module's MEASURES, read without importing it (its peers need not be installed)."""
    for node in ast.parse((SCENARIOS / f"{scenario}.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MEASURES" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_starts_with_its_header(page: Path) -> None:
    header = read(page)  # raises, naming the page and the line, where it is missing
    assert len(header.measures) <= 72 and "(" not in header.measures, "measures: one short line, the index's cell"
    assert re.match(r"\d{4}-\d{2}-\d{2}\b", header.date) or header.date.startswith(("not recorded", "per section"))
    assert SHA.match(header.commit) or header.commit.startswith(("not recorded", "per section"))
    assert "`" in header.command or header.command.startswith(("not recorded", "per section"))
    run = run_record(page)
    if run is None:
        return
    assert header.date == run["date"], f"{page.name}: the header's date is not its run's ({page.stem}.json)"
    assert re.search(r"`(BENCH_\S+ )*python -m bench [a-z_]+", header.command), "a run's page names its command"
    if "commit" in run:  # recorded by the run: the header is the one the run wrote
        assert header == page_header.for_run(header.measures, run)


@pytest.mark.parametrize("page", [p for p in PAGES if (SCENARIOS / f"{p.stem}.py").is_file()], ids=lambda p: p.name)
def test_a_page_says_what_its_scenario_writes(page: Path) -> None:
    """A re-run keeps the page's measures line: it is the scenario's MEASURES (speculative's first: its n-gram page)."""
    constant = measures_constant(page.stem)
    assert read(page).measures == (constant[0] if isinstance(constant, tuple) else constant)


@pytest.mark.parametrize("scenario", sorted(p.stem for p in SCENARIOS.glob("*.py") if p.stem != "__init__"))
def test_every_scenario_writes_its_page_with_a_measures_line(scenario: str) -> None:
    """harness.write needs measures=; a call without it would fail only at the end of an hours-long run."""
    calls = [node for node in ast.walk(ast.parse((SCENARIOS / f"{scenario}.py").read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "write"]
    assert calls, f"{scenario} writes no page through harness.write"
    assert all("measures" in {k.arg for k in call.keywords} for call in calls)
    constant = measures_constant(scenario)
    for line in constant if isinstance(constant, tuple) else [constant]:
        assert isinstance(line, str) and 0 < len(line) <= 72 and "(" not in line


def test_the_readme_index_is_what_the_headers_make() -> None:
    readme = (DOCS / index.README).read_text()
    assert index.render(readme, index.headers(DOCS)) == readme, "run `python -m bench index`"
    rows = [line for line in readme.splitlines() if line.startswith("| [")]
    assert [re.search(r"\]\(([^)]+)\)", row).group(1) for row in rows] == [  # type: ignore[union-attr]
        p.name for p in sorted(PAGES, key=lambda p: p.stem)]


def test_no_readme_line_is_long() -> None:
    long = [(n, len(line)) for n, line in enumerate((DOCS / index.README).read_text().splitlines(), 1)
            if len(line) > 200]
    assert not long, f"README lines over 200 characters (line, length): {long}"


def page(folder: Path, name: str, header: Header | None) -> Path:
    body = "# A page\n\nSome numbers.\n"
    path = folder / f"{name}.md"
    path.write_text(page_header.with_header(body, header) if header else body)
    return path


def test_the_index_sees_a_missing_header_and_a_stale_table(tmp_path: Path) -> None:
    header = Header("one thing", "x86_64, Some CPU, AVX2, no AVX-512, 2 cores", "2026-12-07", "abc1234",
                    "`python -m bench llm`")
    page(tmp_path, "one", header)
    (tmp_path / index.README).write_text(f"# Index\n\n{index.BEGIN}\n{index.END}\n\nProse.\n")
    assert index.main(["--check"], docs=tmp_path) == 1
    assert index.main([], docs=tmp_path) == 0
    made = (tmp_path / index.README).read_text()
    assert "| [one](one.md) | one thing | A | 2026-12-07 | abc1234 | `python -m bench llm` |" in made
    assert "- **A**: x86_64, Some CPU, AVX2, no AVX-512, 2 cores" in made and made.endswith("\n\nProse.\n")
    assert index.main(["--check"], docs=tmp_path) == 0
    page(tmp_path, "two", None)
    with pytest.raises(HeaderError, match=r"two\.md: line 3 is not `- \*\*measures\*\*: "):
        index.headers(tmp_path)
    with pytest.raises(SystemExit) as refused:
        index.main(["--check"], docs=tmp_path)
    assert refused.value.code == 3


def test_a_header_missing_a_field_is_refused(tmp_path: Path) -> None:
    whole = page(tmp_path, "p", Header("m", "x86_64, 2 cores", "2026-12-07", "abc1234", "`python -m bench llm`"))
    lines = whole.read_text().splitlines()
    for at, name in enumerate(FIELDS):
        whole.write_text("\n".join(lines[:2 + at] + lines[3 + at:]) + "\n")
        with pytest.raises(HeaderError, match=rf"line {at + 3} is not `- \*\*{name}\*\*: "):
            read(whole)


def test_a_run_writes_its_page_with_the_header_under_the_title(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page_header, "_run", {})
    monkeypatch.setenv("BENCH_CONTEXT_SHAPES", "100m")
    page_header.start_run("embeddings", ["all", "--repeats", "2"], "all")
    record = machine()
    path = write("embeddings", {"machine": record}, "# Embeddings\n\nArms.\n", tmp_path, measures="embeddings served")
    header = read(path)
    assert header.measures == "embeddings served"
    assert header.command == "`BENCH_CONTEXT_SHAPES=100m python -m bench embeddings --repeats 2`"
    assert header.date == record["date"] and header.machine == f"{record['cpu']}, {record['cores']} cores"
    in_git = (ROOT / ".git").exists()  # a worktree's .git is a file
    assert SHA.fullmatch(header.commit) if in_git else header.commit.startswith("not recorded"), header.commit
    text = path.read_text()
    assert text.startswith("# Embeddings\n\n- **measures**: ") and text.endswith("\n\nArms.\n")
    assert json.loads((tmp_path / "embeddings.json").read_text())["machine"]["command"] == header.command.strip("`")


def test_bench_index_check_passes_on_this_checkout() -> None:
    shown = subprocess.run([sys.executable, "-m", "bench", "index", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
