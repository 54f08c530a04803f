"""Where a server's start goes, from what it says: the phases in the timeline mbuild's server logs at ready
(runtimes/startup.py), and a process's imports by package from `python -X importtime` (bench/scenarios/start_ready.py).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

# "model ready: NAME (1.02 s after the start: server process 0.21 s, imports 0.65 s, ..., ready 1.02 s)"
_TIMELINE = re.compile(r"after the start: (.*)\)\s*$")
_MARK = re.compile(r"([^,]+?) (\d+(?:\.\d+)?) s")
# what each mark ends: the page's names for the span from the mark before it
SPANS = {"server process": "mbuild serve's checks and the supervisor's, to the server process",
         "imports": "the server's imports (FastAPI, numpy, ONNX Runtime, the routes)",
         "app": "settings, the app and its routes, uvicorn's event loop",
         "engine": "the engine: ONNX Runtime session, tokenizer, KV pool",
         "warm-up": "warm-up (a prompt and a decode step)", "ready": "to ready"}
SEEN = "until the client's poll saw 200"


def marks(log: str) -> dict[str, float]:
    """The last start timeline in a server's log: {phase: seconds since the start it ended at}; {} if none."""
    found = [m for line in log.splitlines() if (m := _TIMELINE.search(line))]
    if not found:
        return {}
    return {name.strip(): float(seconds) for name, seconds in _MARK.findall(found[-1].group(1))}


def spans(timeline: dict[str, float], total: float) -> dict[str, float]:
    """Each phase's own seconds (its mark less the one before), then what the client waited past the last mark,
    from a start's marks and the client's `total` seconds to its first 200."""
    found, before = {}, 0.0
    for name, at in timeline.items():
        found[name], before = at - before, at
    if found:  # the marks count from /proc's start time, in 10 ms steps: up to 10 ms ahead of the client's clock
        found[SEEN] = max(0.0, total - before)
    return found


def median_spans(starts: list[dict[str, float]]) -> dict[str, float]:
    """The median of each span over the starts that logged it, in the order they first appear."""
    names = list(dict.fromkeys(name for start in starts for name in start))
    return {name: statistics.median(start[name] for start in starts if name in start) for name in names}


def imports_by_package(importtime: str, top: int = 8) -> dict[str, float]:
    """`-X importtime`'s self times summed by top-level package, in seconds, the `top` largest then the rest."""
    totals: dict[str, float] = defaultdict(float)
    for line in importtime.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header line, or another program's output
        totals[parts[2].strip().split(".")[0]] += int(parts[0]) / 1e6
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    shown = dict(ranked[:top])
    if len(ranked) > top:
        shown["the rest"] = sum(seconds for _, seconds in ranked[top:])
    return shown
