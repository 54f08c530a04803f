"""docs/settings.md's table of variables, written from their declarations (runtimes/settings.py's IMAGE_VARIABLES,
builder/settings.py's HOST_VARIABLES) between two markers; the prose around it is the page's own.
`python -m builder.settings_doc` rewrites it; tests/unit/tree/test_env_reads.py fails while the page differs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from builder.settings import HOST_VARIABLES
from runtimes.envparse import Var
from runtimes.settings import IMAGE_VARIABLES

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"
BEGIN = "<!-- written from the declarations by `python -m builder.settings_doc`; edit those, not this table -->"
END = "<!-- end of the written table -->"
SIDES = (("image", IMAGE_VARIABLES), ("build host", HOST_VARIABLES))


def _bound(number: int) -> str:
    """A range's end; a large power of two as one (2^30), as a reader sizes it."""
    return f"2^{number.bit_length() - 1}" if number >= 1 << 20 and number & (number - 1) == 0 else str(number)


def type_text(var: Var) -> str:
    match var.kind:
        case "integer":
            word = f"integer {var.unit + ' ' if var.unit else ''}{_bound(var.low)}..{_bound(var.high)}"
        case "choice":
            word = ", ".join(var.choices)
        case "words":
            word = f"comma-separated {var.unit or 'words'}"
        case "url":
            word = "URL"
        case _:
            word = var.kind
    return var.type_doc.replace("{}", word)


def default_text(var: Var) -> str:
    value = var.default
    if value is None:
        shown = "unset"
    elif isinstance(value, bool):
        shown = "on" if value else "off"
    elif isinstance(value, int | float):
        shown = str(int(value)) if float(value).is_integer() else str(value)  # 30.0 seconds reads as 30
    elif isinstance(value, frozenset):
        shown = ", ".join(sorted(value)) or "none"
    else:  # a choice as its word; a text, path or URL as code
        shown = value if var.kind == "choice" else f"`{value}`"
    return var.default_doc.replace("{}", shown)


def rows(side: str, var: Var) -> Iterator[str]:
    yield f"| `{var.variable}` | {side} | {type_text(var)} | {default_text(var)} | {var.doc} |"
    if var.alias:
        takes = f"as `{var.variable}`" if var.kind == "choice" else type_text(var)
        yield f"| `{var.alias}` | {side} | {takes} | unset | NIM's name for `{var.variable}` |"


def table() -> str:
    lines = [BEGIN, "", "| variable | side | type | default | meaning |", "| --- | --- | --- | --- | --- |",
             *(row for side, declared in SIDES for var in declared for row in rows(side, var)), "", END]
    return "\n".join(lines)


def settings_page(page: str) -> str:
    """`page` with the table between its markers written afresh."""
    before, marked, rest = page.partition(BEGIN)
    _, ended, after = rest.partition(END)
    if not (marked and ended):
        raise ValueError(f"docs/settings.md lacks the markers around its table: {BEGIN} ... {END}")
    return before + table() + after


if __name__ == "__main__":
    DOC.write_text(settings_page(DOC.read_text()))
