"""The header every page in docs/benchmarks/ starts with, right under its title: what the page measures, the machine,
the date, the commit and the command that made it, one `- **field**: value` line each, in this order. Scenarios
write it through harness.write; hand-written pages carry it by hand; `python -m bench index` reads them all into the
README's table (bench/lib/index.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks"
NOT_RUN_BY_BENCH = "not recorded (not run by `python -m bench`)"
_run: dict[str, str] = {}  # this process's command and checkout, set by `python -m bench` before a scenario runs


class HeaderError(ValueError):
    """A page without a whole header: the message names the page and what is missing."""


@dataclass(frozen=True)
class Header:
    measures: str
    machine: str
    date: str
    commit: str
    command: str

    def lines(self) -> list[str]:
        return [f"- **{field.name}**: {value}" for field, value in zip(fields(self), astuple(self), strict=True)]


FIELDS = tuple(field.name for field in fields(Header))


def checkout() -> str:
    """HEAD's short sha, with `-dirty` where files outside docs/ differ from it (a run rewrites pages under docs/,
    so those say nothing about the code it ran)."""
    try:
        sha = _git("rev-parse", "--short=7", "HEAD")
        changed = _git("status", "--porcelain", "--", ".", ":(exclude)docs")
    except (OSError, subprocess.SubprocessError):
        return "not recorded (no git checkout)"
    return f"{sha}-dirty" if changed else sha


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def start_run(scenario: str, argv: list[str], typed: str) -> None:
    """Record the command that reproduces `scenario`'s pages (argv as typed, `typed` -- the scenario or `all` --
    replaced by the scenario's name, after the BENCH_* settings it ran with) and the checkout, before it runs."""
    settings = [f"{key}={shlex.quote(value)}" for key, value in sorted(os.environ.items()) if key.startswith("BENCH_")]
    args = list(argv)
    if typed in args:
        args[args.index(typed)] = scenario
    _run.update(command=" ".join([*settings, "python -m bench", shlex.join(args)]), commit=checkout())


def run_record() -> dict[str, str]:
    """The command and commit a run's record (harness.machine) carries into its .json and its page's header."""
    return {"command": _run.get("command", NOT_RUN_BY_BENCH), "commit": _run.get("commit") or checkout()}


def for_run(measures: str, run: dict[str, Any]) -> Header:
    """The header of a page a run writes, from its record (harness.machine's: cpu, cores, date, commit, command)."""
    command = run.get("command", NOT_RUN_BY_BENCH)
    return Header(measures=measures, machine=f"{run.get('cpu', 'not recorded')}, {run.get('cores', '?')} cores",
                  date=str(run.get("date", "not recorded")), commit=str(run.get("commit", "not recorded")),
                  command=command if command.startswith("not recorded") else f"`{command}`")


def with_header(markdown: str, header: Header) -> str:
    """`markdown` with `header` right under its title line."""
    title, _, body = markdown.partition("\n")
    if not title.startswith("# "):
        raise HeaderError(f"a page starts with its `# ` title, not {title[:60]!r}")
    return "\n".join([title, "", *header.lines(), "", body.lstrip("\n")])


def read(path: Path) -> Header:
    """The header of the page at `path`: the lines right under its title, each field once, in FIELDS' order."""
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise HeaderError(f"{path.name}: the first line is not a `# ` title")
    found = lines[2:2 + len(FIELDS)]
    values = []
    for at, name in enumerate(FIELDS):
        prefix = f"- **{name}**: "
        line = found[at] if at < len(found) else ""
        if not line.startswith(prefix) or not line[len(prefix):].strip():
            raise HeaderError(f"{path.name}: line {at + 3} is not `{prefix}...`: every page starts with its title, "
                              f"a blank line and the header's lines {', '.join(FIELDS)} (bench/lib/page_header.py)")
        values.append(line[len(prefix):].strip())
    if lines[1].strip() or (len(lines) > 2 + len(FIELDS) and lines[2 + len(FIELDS)].strip()):
        raise HeaderError(f"{path.name}: the header stands alone, a blank line before and after it")
    return Header(*values)
