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
            self.timings[name] = time.perf_counter() - start
            if not self.quiet:
                self.console.print(f"[red]✗[/] {name:<9} failed after {self.timings[name]:.1f}s")
            raise
        self.timings[name] = time.perf_counter() - start
        if not self.quiet:
            self.console.print(f"[green]✓[/] {name:<9} {doing} ({self.timings[name]:.1f}s)")

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"  {text}")

    def skipped(self, name: str, why: str) -> None:
        self.timings[name] = 0.0
        if not self.quiet:
            self.console.print(f"[yellow]-[/] {name:<9} {why}")
