"""Readiness as a small state machine, shared by the health routes and the shutdown path.

    starting -> loading -> warming -> ready -> draining
                   \\----------\\-> failed

Only `ready` answers 200 on READY (/v1/health/ready). `failed` keeps its reason for the logs and the route.
"""

from __future__ import annotations

import threading
from enum import StrEnum

# The routes that report it, written here once: runtimes/api/probes.py serves them; the image's HEALTHCHECK, the
# deploy manifests, `mbuild bench` and the benchmarks ask them.
LIVE = "/v1/health/live"
READY = "/v1/health/ready"
METRICS = "/v1/metrics"


class State(StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


_ALLOWED = {
    State.STARTING: {State.LOADING, State.FAILED, State.DRAINING},
    State.LOADING: {State.WARMING, State.FAILED, State.DRAINING},
    State.WARMING: {State.READY, State.FAILED, State.DRAINING},
    State.READY: {State.DRAINING},
    State.DRAINING: set(),
    State.FAILED: {State.DRAINING},
}


class Health:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = State.STARTING
        self.reason = ""

    def move(self, new: State, reason: str = "") -> None:
        with self._lock:
            if new not in _ALLOWED[self.state]:
                raise RuntimeError(f"health cannot go from {self.state.value} to {new.value}")
            self.state, self.reason = new, reason

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def serving(self) -> bool:
        """Requests are answered: ready, or draining (readiness says 503 then, but in-flight and new work runs)."""
        return self.state in (State.READY, State.DRAINING)
