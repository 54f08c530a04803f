"""Typed reads of one environment mapping: the one boolean, integer and choice parser that both settings modules
use (runtimes/settings.py in the image, builder/settings.py on the build host), so `0`, `off` or a port means
the same on both sides. It parses the mapping it is given and never touches os.environ itself.

A variable set to an empty (or blank) value counts as unset. A set value that cannot be used is an error that
names the variable as the user wrote it, never a default used in its place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
_T = TypeVar("_T")


class EnvError(ValueError):
    """A set variable whose value cannot be used; the message names it and says what it takes."""


class EnvReader:
    """Reads variables of `env`. `aliases` maps a name to another one honoured for it (NIM's container variables):
    the name itself wins when both are set, and the alias's value is checked all the same."""

    def __init__(self, env: Mapping[str, str], aliases: Mapping[str, str] | None = None,
                 error: Callable[[str], Exception] = EnvError) -> None:
        self.env, self.aliases, self.error = env, dict(aliases or {}), error

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
