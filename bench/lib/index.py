"""`python -m bench index [--check]`: docs/benchmarks/README.md's table of pages, one row per page made from its header
(bench/lib/page_header.py), between the README's two marker lines; the prose around them is the README's own. Machines
are named once, under the table, by letter: their lines are too long for a row."""

from __future__ import annotations

import argparse
import string
from pathlib import Path

from bench.lib.page_header import DOCS, Header, HeaderError, read

BEGIN = "<!-- index: `python -m bench index` makes the lines from here to the end marker from the pages' headers -->"
END = "<!-- end of index -->"
README = "README.md"


def headers(docs: Path = DOCS) -> dict[str, Header]:
    """Every page's header, by file name in the order of their names (kv_memory before kv_memory-1b); a page without
    one is an error that names it."""
    return {path.name: read(path) for path in sorted(docs.glob("*.md"), key=lambda p: p.stem) if path.name != README}


def _cell(value: str) -> str:
    """A field as the table shows it: what comes before its first parenthesis (the page says the rest)."""
    return value.split(" (", 1)[0].replace("|", "\\|")


def table(pages: dict[str, Header]) -> list[str]:
    """The index's lines: the table, then each machine by its letter, the earliest run's machine first."""
    first: dict[str, str] = {}
    for header in sorted(pages.values(), key=lambda h: (h.date, h.machine)):
        first.setdefault(header.machine, string.ascii_uppercase[len(first)])
    rows = ["| page | measures | machine | date | commit | command |", "| --- | --- | :-: | --- | --- | --- |"]
    rows += [f"| [{Path(name).stem}]({name}) | {_cell(h.measures)} | {first[h.machine]} | {_cell(h.date)} | "
             f"{_cell(h.commit)} | {_cell(h.command)} |" for name, h in pages.items()]
    return [*rows, "", "Machines, as each page's header names them:", "",
            *(f"- **{letter}**: {machine}" for machine, letter in first.items())]


def render(readme: str, pages: dict[str, Header]) -> str:
    """`readme` with the lines between its markers made from `pages`."""
    before, begin, rest = readme.partition(BEGIN + "\n")
    _, end, after = rest.partition(END + "\n")
    if not begin or not end:
        raise HeaderError(f"{README} has no index markers: put a line `{BEGIN}` and a line `{END}` where the "
                          "table goes")
    return "".join([before, begin, "\n".join(table(pages)), "\n", end, after])


def main(argv: list[str] | None = None, docs: Path = DOCS) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench index", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the table is stale")
    args = parser.parse_args(argv)
    path = docs / README
    try:
        made = render(path.read_text(), headers(docs))
    except HeaderError as error:
        parser.exit(3, f"bench index: {error}\n")
    if made == path.read_text():
        print(f"{path}: the index is up to date")
        return 0
    if args.check:
        print(f"{path}: the index is stale: run `python -m bench index`")
        return 1
    path.write_text(made)
    print(f"{path}: index rewritten from {len(headers(docs))} pages' headers")
    return 0
