"""`mbuild bench -o DIR` removes nothing it did not write: every option is checked before the folder is touched,
a folder holding anything an earlier bench did not list is refused before any work, and a link in it is never
followed. The earlier run here is a real one: a build whose server dies at start leaves its server.log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from builder.cli import INTERNAL_ERROR, cli
from builder.errors import BenchFailed, OutputUnusable
from tests.support.bundles import write_bundle_files

FITS = ["--isl", "64"]  # the stand-in encoder holds 128 tokens a passage


def run(args: list[str]) -> Result:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != INTERNAL_ERROR and "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def build(tmp_path: Path) -> Path:
    """A build directory whose server ends at start (engine.json without a model): a bench of it fails fast,
    after writing its server.log."""
    write_bundle_files(tmp_path / "build" / "model", True)
    return tmp_path / "build"


@pytest.fixture
def earlier(build: Path, tmp_path: Path) -> Path:
    """The folder an earlier `mbuild bench` left."""
    out = tmp_path / "out"
    first = run(["bench", str(build), "-o", str(out), *FITS])
    assert first.exit_code == BenchFailed.exit_code and "ended before it was ready" in first.output, first.output
    assert (out / "server.log").is_file()
    return out


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() if p.is_file() and not p.is_symlink() else "" for p in
            sorted(folder.rglob("*"))}


@pytest.mark.parametrize("args", [["--isl", "-1"], ["--osl", "0"], ["--cores", "4000"],
                                  ["--prompts", "/nonexistent.jsonl"], ["--isl", "4096"]])
def test_a_bad_option_leaves_an_earlier_run_as_it_was(build: Path, earlier: Path, args: list[str]) -> None:
    before = _tree(earlier)
    result = run(["bench", str(build), "-o", str(earlier), *args])
    assert result.exit_code == 2 and "hint:" in result.output, result.output
    assert _tree(earlier) == before


def test_an_earlier_runs_folder_is_taken_again(build: Path, earlier: Path) -> None:
    again = run(["bench", str(build), "-o", str(earlier), *FITS])
    assert again.exit_code == BenchFailed.exit_code, again.output  # not refused: what is there, bench wrote
    assert (earlier / "server.log").is_file()


def test_files_the_user_put_there_are_refused_and_kept(build: Path, earlier: Path, tmp_path: Path) -> None:
    # The very files given to this run, in the folder: the case (they were deleted before being read).
    (earlier / "prompts.jsonl").write_text('{"text": "my prompt"}\n')
    (earlier / "tokenizer").mkdir()
    (earlier / "tokenizer" / "tokenizer.json").write_text("{}")
    (earlier / "bench.json").write_text("{}")
    before = _tree(earlier)
    result = run(["bench", str(build), "-o", str(earlier), *FITS, "--prompts", str(earlier / "prompts.jsonl")])
    assert result.exit_code == OutputUnusable.exit_code, result.output
    assert "did not write (bench.json, prompts.jsonl, tokenizer)" in result.output
    assert "new or empty --output folder" in result.output
    assert _tree(earlier) == before
    given = run(["bench", str(build), "-o", str(earlier), *FITS, "--tokenizer", str(earlier / "tokenizer")])
    assert given.exit_code == 2 and "lies inside --output" in given.output, given.output
    assert _tree(earlier) == before


def test_a_link_in_the_folder_is_refused_not_followed(build: Path, earlier: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter 1")
    (earlier / "aiperf").symlink_to(mine)
    (earlier / "bench.json").write_text("{}")
    result = run(["bench", str(build), "-o", str(earlier), *FITS])
    assert result.exit_code == OutputUnusable.exit_code and "aiperf (a link)" in result.output, result.output
    assert (mine / "thesis.tex").read_text() == "chapter 1" and (earlier / "aiperf").is_symlink()


def test_a_forged_list_names_no_file_of_the_users(build: Path, earlier: Path) -> None:
    manifest = next(p for p in earlier.iterdir() if p.name.startswith(".mbuild"))
    manifest.write_text(json.dumps({"format": 1, "written": ["server.log", "thesis.tex", "../outside"]}))
    (earlier / "thesis.tex").write_text("chapter 1")
    result = run(["bench", str(build), "-o", str(earlier), *FITS])
    assert result.exit_code == OutputUnusable.exit_code and "(thesis.tex)" in result.output, result.output
    assert (earlier / "thesis.tex").read_text() == "chapter 1"
