"""Typed reads of one environment mapping: the one boolean, integer and choice parser that both settings modules
use (runtimes/settings.py in the image, builder/settings.py on the build host), so `0`, `off` or a port means
the same on both sides. It parses the mapping it is given and never touches os.environ itself.

A variable set to an empty (or blank) value counts as unset. A set value that cannot be used is an error that
names the variable as the user wrote it, never a default used in its place.

Each variable is declared once, as a Var: the field it fills, its kind, bounds, default and the words of its row
in docs/settings.md (builder/settings_doc.py writes the table from them); read_all reads one side's declarations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
_T = TypeVar("_T")
Kind = Literal["boolean", "integer", "text", "path", "url", "words", "choice"]


@dataclass(frozen=True)
class Var:
    """One environment variable, declared once: the setting it fills, how it is read, and its docs/settings.md row."""

    name: str | None  # the settings field it fills; None: code beside reads it (flag(), a special case)
    variable: str
    kind: Kind  # url: text without a trailing slash; words: a comma-separated set
    default: Any  # when unset; the settings class's field default too
    doc: str  # the table's meaning column, as the table shows it
    low: int = 0  # an integer's bounds
    high: int = 0
    choices: tuple[str, ...] = ()
    alias: str | None = None  # NIM's name for it, honoured as it (EnvReader's aliases)
    # a default that depends on the environment (the build host's folders): given the value of another variable
    # by name, defaults included, it returns this one's
    derive: Callable[[Callable[[str], Any]], Any] | None = None
    unit: str = ""  # the table's type column: "integer seconds 1..3600", "comma-separated hosts"
    type_doc: str = "{}"  # the table's type column, where the kind's word needs more; {} stands for that word
    default_doc: str = "{}"  # the table's default column, likewise; {} stands for the default as written


class EnvError(ValueError):
    """A set variable whose value cannot be used; the message names it and says what it takes."""


class EnvReader:
    """Reads variables of `env`. `aliases` maps a name to another one honoured for it (NIM's container variables):
    the name itself wins when both are set, and the alias's value is checked all the same."""

    def __init__(self, env: Mapping[str, str], aliases: Mapping[str, str] | None = None,
                 error: Callable[[str], Exception] = EnvError) -> None:
        self.env, self.aliases, self.error = env, dict(aliases or {}), error

    def read_all(self, declared: Iterable[Var]) -> dict[str, Any]:
        """Every declared variable's value by variable name, None where unset, in declaration order (so a bad value
        stops the first one met)."""
        return {var.variable: self.declared(var) for var in declared}

    def declared(self, var: Var) -> Any:
        """`var` as its kind reads it; None where unset (an empty set for words)."""
        match var.kind:
            case "integer":
                return self.integer(var.variable, var.low, var.high)
            case "choice":
                return self.choice(var.variable, var.choices)
            case "boolean":
                return self.boolean(var.variable)
            case "path":
                return self.path(var.variable)
            case "words":
                return self.words(var.variable)
            case "url":
                url = self.text(var.variable)
                return None if url is None else url.rstrip("/")
            case "text":
                return self.text(var.variable)

    def raw(self, name: str) -> str | None:
        """The value exactly as set (None: unset); for the few variables where set-but-empty means something."""
        return self.env.get(name)

    def _read(self, name: str, parse: Callable[[str, str], _T]) -> _T | None:
        found: list[_T] = []
        for variable in (name, self.aliases[name]) if name in self.aliases else (name,):
            raw = self.env.get(variable, "").strip()
            if raw:
                found.append(parse(variable if variable == name else f"{variable} (read as {name})", raw))
        return found[0] if found else None

    def text(self, name: str) -> str | None:
        return self._read(name, lambda _, raw: raw)

    def path(self, name: str) -> Path | None:
        return self._read(name, lambda _, raw: Path(raw).expanduser())

    def words(self, name: str) -> frozenset[str]:
        """A comma-separated list."""
        listed = self._read(name, lambda _, raw: frozenset(w.strip() for w in raw.split(",") if w.strip()))
        return listed or frozenset()

    def integer(self, name: str, low: int, high: int) -> int | None:
        def parse(label: str, raw: str) -> int:
            if not re.fullmatch(r"-?[0-9]+", raw):
                raise self.error(f"{label}={raw!r} is not an integer")
            if not low <= int(raw) <= high:
                raise self.error(f"{label}={int(raw)} is outside {low}..{high}")
            return int(raw)
        return self._read(name, parse)

    def boolean(self, name: str) -> bool | None:
        def parse(label: str, raw: str) -> bool:
            if raw.lower() not in TRUE | FALSE:
                raise self.error(f"{label}={raw!r}: use 1/true/yes/on or 0/false/no/off")
            return raw.lower() in TRUE
        return self._read(name, parse)

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        def parse(label: str, raw: str) -> str:
            if raw.lower() not in choices:
                raise self.error(f"{label}={raw.lower()!r}: use one of {', '.join(choices)}")
            return raw.lower()
        return self._read(name, parse)


def field_values(declared: Iterable[Var], read: Mapping[str, Any]) -> dict[str, Any]:
    """The settings fields' values from read_all's: each read one, else its default, derived on demand (a
    variable that fills no field may still lend its value to another's default)."""
    by_variable = {var.variable: var for var in declared}
    known: dict[str, Any] = {}

    def value(variable: str) -> Any:
        if variable not in known:
            var = by_variable[variable]
            got = read[variable]
            known[variable] = got if got is not None else var.derive(value) if var.derive else var.default
        return known[variable]

    return {var.name: value(var.variable) for var in by_variable.values() if var.name}
