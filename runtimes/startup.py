"""The start's timeline: when each phase of a server's start ended, in seconds since the start began, logged once at
ready so that an operator (and bench/scenarios/start_ready.py) sees where a cold start's time went.

runtimes/server.py counts from its parent's start, the supervisor's, read from Linux's /proc (10 ms steps): under
`mbuild serve` that is the command's own start, as the command execs the supervisor; in an image, PID 1's. A server
run otherwise (BentoML's worker) counts from its own process's start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def started_at(pid: int | str = "self") -> float | None:
    """When process `pid` started, on CLOCK_BOOTTIME's scale (seconds since boot); None where /proc cannot say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, stat's 22nd field, in clock ticks
    except (OSError, ValueError, IndexError):
        return None


def now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Timeline:
    """Marks of the phases in the order they end, each in seconds since `origin` (on now()'s scale), which `since`
    names in the log."""

    def __init__(self, origin: float, since: str) -> None:
        self.origin, self.since = origin, since
        self.marks: dict[str, float] = {}

    @classmethod
    def of_process(cls, pid: int | str = "self", since: str = "this process's start") -> Timeline:
        """Counted from process `pid`'s start (this process's where /proc cannot say)."""
        return cls(started_at(pid) or started_at() or now(), since)

    def mark(self, phase: str, at: float | None = None) -> None:
        self.marks[phase] = (now() if at is None else at) - self.origin

    def summary(self) -> str:
        """"0.52 s after the start: phase 0.12 s, phase 0.50 s, ...": the last mark, then when each phase ended."""
        last = f"{list(self.marks.values())[-1]:.2f} s after " if self.marks else ""
        return f"{last}{self.since}: " + ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.marks.items())
