"""The container's PID 1: runs the server as a child and turns SIGTERM into a drain.

    SIGTERM -> readiness 503 (the flag file tells the worker), keep serving for MBUILD_DRAIN_SECONDS
            so load balancers stop sending -> SIGTERM to the server, whose in-flight requests
            finish -> exit 0 once every server process is gone (SIGKILL after the grace period).
    SIGINT  -> the same without the wait (Ctrl+C on a terminal).
    The worker could not load the model (it writes MBUILD_FAILED_FLAG) -> stop the server, exit 3:
            a model that never loads must not sit there answering 503 forever.

As PID 1 it also reaps orphaned processes, which nothing else in the container would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from runtimes.exits import Exit

POLL_SECONDS = 0.1


class Supervisor:
    def __init__(self, command: list[str], env: dict[str, str], flag: Path, drain_seconds: float,
                 grace_seconds: float, failed: Path | None = None) -> None:
        self.command, self.env, self.flag = command, env, flag
        self.failed = failed
        self.load_failed = False
        self.drain_seconds, self.grace_seconds = drain_seconds, grace_seconds
        self.stop_at: float | None = None  # when the server gets its SIGTERM
        self.kill_at: float | None = None  # when leftovers get SIGKILL
        self.server_status: int | None = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stop_at is not None:
            return
        self.flag.parent.mkdir(parents=True, exist_ok=True)
        self.flag.touch()
        delay = self.drain_seconds if signum == signal.SIGTERM else 0.0
        self.stop_at = time.monotonic() + delay

    def _reap(self, pid: int) -> None:
        while True:
            try:
                child, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if child == 0:
                return
            if child == pid:
                self.server_status = os.waitstatus_to_exitcode(status)

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def run(self) -> int:
        self.flag.unlink(missing_ok=True)
        if self.failed is not None:
            self.failed.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        server = subprocess.Popen(self.command, env=self.env, start_new_session=True)
        pgid = server.pid
        while True:
            self._reap(server.pid)
            now = time.monotonic()
            if self.failed is not None and self.stop_at is None and self.failed.is_file():
                reason = self.failed.read_text(errors="replace").strip()
                print(f"mbuild runtime: the model failed to load, stopping: {reason}", file=sys.stderr, flush=True)
                self.load_failed = True
                self.stop_at = now
            if self.stop_at is not None and self.kill_at is None and now >= self.stop_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                self.kill_at = now + self.grace_seconds
            if self.kill_at is not None and now >= self.kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            if self.server_status is not None and not self._group_alive(pgid):
                break
            if self.server_status is not None and self.stop_at is None:
                break  # the server died by itself: pass its failure on
            time.sleep(POLL_SECONDS)
        self.flag.unlink(missing_ok=True)
        if self.load_failed:
            return Exit.BROKEN_BUNDLE
        if self.stop_at is not None:
            return 0  # a requested stop that drained is a clean exit
        return self.server_status or 1
