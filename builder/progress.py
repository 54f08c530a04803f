"""Stage progress on the terminal: a spinner per stage, a line when it ends, timings for the summary.

The CLI creates one Reporter; stages only call `with reporter.stage(...)` and `reporter.note(...)`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console


class Reporter:
    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        # Logs and CI capture stderr: no wrapping there, so every line stays one line.
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True,
                                          width=None if sys.stderr.isatty() else 160)
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, doing: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            if self.quiet:
                yield
            else:
                with self.console.status(f"[bold]{name}[/]: {doing}", spinner="dots"):
                    yield
        except BaseException:
            took = self._took(name, start)
            if not self.quiet:
                self.console.print(f"[red]✗[/] {name:<9} failed after {took:.1f}s")
            raise
        took = self._took(name, start)
        if not self.quiet:
            self.console.print(f"[green]✓[/] {name:<9} {doing} ({took:.1f}s)")

    def _took(self, name: str, start: float) -> float:
        """A stage's time; the summary's adds up a stage run more than once (a draft model's export after the
        target's, a build retried at another precision)."""
        took = time.perf_counter() - start
        self.timings[name] = self.timings.get(name, 0.0) + took
        return took

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"  {text}")

    def skipped(self, name: str, why: str) -> None:
        self.timings.setdefault(name, 0.0)
        if not self.quiet:
            self.console.print(f"[yellow]-[/] {name:<9} {why}")
