"""A command under a memory sampler: the resident memory of its whole process tree every ~0.1 s (summed over the
tree), with each stderr line stamped as it arrives, so a stage's samples can be told from the rest (mbuild
prints one line per finished stage: "✓ export    checkpoint -> ONNX ... (12.3s)", builder/progress.py)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

# "✓ export ... (12.3s)", "✗ export    failed after 3.1s", "- image     --backend none: ..." (a skipped stage)
STAGE = re.compile(r"^([✓✗-]) (\w+)\s")
SECONDS = re.compile(r"\((\d+(?:\.\d+)?)s\)$|after (\d+(?:\.\d+)?)s$")


@dataclass
class Sampled:
    """One run: exit status, wall time, (seconds, RSS, anonymous RSS) samples and stamped stderr lines."""

    rc: int
    wall_s: float
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    stderr: list[tuple[float, str]] = field(default_factory=list)
    stdout_tail: list[str] = field(default_factory=list)

    def peak(self, start: float = 0.0, end: float = math.inf) -> tuple[int, int]:
        """The highest RSS and highest anonymous RSS sampled in [start, end]."""
        window = [s for s in self.samples if start <= s[0] <= end] or [(0.0, 0, 0)]
        return max(s[1] for s in window), max(s[2] for s in window)

    def stages(self) -> list[tuple[str, float, float | None]]:
        """(stage, when its line came, the seconds it printed) in the order the stages ended."""
        found = []
        for when, line in self.stderr:
            if match := STAGE.match(line):
                took = SECONDS.search(line.rstrip())
                found.append((match[2], when, float(took[1] or took[2]) if took else None))
        return found

    def windows(self) -> dict[str, tuple[float, float]]:
        """Each stage that ended: from the previous stage's line (or the start) to its own line."""
        found, start = {}, 0.0
        for name, when, _ in self.stages():
            found[name], start = (start, when), when
        return found

    def peak_stage(self) -> str | None:
        """The stage whose window holds the highest RSS sample; None after the last stage line (or none)."""
        if not self.samples:
            return None
        when = max(self.samples, key=lambda s: s[1])[0]
        return next((name for name, (start, end) in self.windows().items() if start <= when <= end), None)

    def tail(self, lines: int = 12) -> list[str]:
        return [line for _, line in self.stderr[-lines:]] or self.stdout_tail[-lines:]

    def summary(self) -> dict[str, Any]:
        """What a report keeps of a run: exit status, wall time, peaks, the stage at the peak, the last lines of a
        failed one."""
        peak, anon = self.peak()
        result: dict[str, Any] = {"rc": self.rc, "wall_s": round(self.wall_s, 2), "peak_rss": peak, "peak_anon": anon,
                                  "samples": len(self.samples), "peak_stage": self.peak_stage()}
        if self.rc:
            result["tail"] = self.tail()
        return result


def tree_memory(root: psutil.Process) -> tuple[int, int]:
    """RSS and anonymous RSS (RSS less its file-backed and shared pages: statm's resident - shared), summed over
    `root` and its descendants; a process that ends while being read counts as nothing."""
    rss = anon = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for process in processes:
        try:
            info = process.memory_info()
        except psutil.Error:
            continue
        rss += info.rss
        anon += info.rss - getattr(info, "shared", 0)
    return rss, anon


def run_sampled(command: list[str], env: dict[str, str], interval: float = 0.1, cwd: Path | None = None) -> Sampled:
    """Run `command`, sampling its tree's memory every `interval` seconds until it exits."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace")
    assert proc.stdout is not None and proc.stderr is not None
    stderr: list[tuple[float, str]] = []
    stdout: deque[str] = deque(maxlen=40)

    def read(stream: IO[str], keep: Callable[[str], None]) -> None:
        for line in stream:
            keep(line.rstrip("\n"))

    readers = [threading.Thread(target=read, args=(proc.stderr, lambda line: stderr.append(
                   (time.perf_counter() - started, line))), daemon=True),
               threading.Thread(target=read, args=(proc.stdout, stdout.append), daemon=True)]
    for reader in readers:
        reader.start()
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, int, int]] = []
    while proc.poll() is None:
        rss, anon = tree_memory(root)
        if rss:
            samples.append((time.perf_counter() - started, rss, anon))
        time.sleep(interval)
    wall = time.perf_counter() - started
    for reader in readers:
        reader.join()
    proc.stdout.close()
    proc.stderr.close()
    return Sampled(proc.returncode, wall, samples, stderr, list(stdout))


def disk_bytes(path: Path) -> int:
    """What `du -s` counts: allocated blocks, a hard-linked file once; 0 when `path` is missing."""
    if not path.exists():
        return 0
    entries = [path]
    if path.is_dir():
        entries += [Path(folder) / name for folder, dirs, files in os.walk(path) for name in (*dirs, *files)]
    blocks = {}
    for entry in entries:
        info = entry.lstat()
        blocks[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(blocks.values())
