"""Energy over a sweep point, where this host exposes it: Intel RAPL's package counters on the CPU
(/sys/class/powercap), NVML's total energy on NVIDIA GPUs. Where neither can be read, the reason, never a guess."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

POWERCAP = Path("/sys/class/powercap")
T = TypeVar("T")


@dataclass(frozen=True)
class Meter:
    how: str  # what is read, or why nothing is
    read: Callable[[], float] | None  # joules so far

    def measure(self, work: Callable[[], T]) -> tuple[T, float | None]:
        if self.read is None:
            return work(), None
        start = self.read()
        done = work()
        return done, max(0.0, self.read() - start)


def _rapl() -> Meter | None:
    # Package domains only (intel-rapl:N): their sub-domains (core, dram) are inside them.
    zones = sorted(p for p in POWERCAP.glob("intel-rapl:*") if p.name.count(":") == 1) if POWERCAP.is_dir() else []
    readable = [z for z in zones if (z / "energy_uj").is_file()]
    if not readable:
        return None
    try:
        wraps = {z: int((z / "max_energy_range_uj").read_text()) for z in readable}
        [int((z / "energy_uj").read_text()) for z in readable]
    except (OSError, ValueError):
        return Meter(f"RAPL counters under {POWERCAP} are not readable by this user (root can read them)", None)
    last: dict[Path, int] = {}
    total = [0.0]

    def read() -> float:  # the counters wrap at max_energy_range_uj: sum the steps
        for zone in readable:
            now = int((zone / "energy_uj").read_text())
            if zone in last:
                total[0] += ((now - last[zone]) % wraps[zone]) / 1e6
            last[zone] = now
        return total[0]
    return Meter(f"RAPL, {len(readable)} CPU package(s): the whole package, not the server alone", read)


def _nvml() -> Meter | None:
    try:
        import pynvml  # nvidia-ml-py, which AIPerf brings
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no library, no driver, no GPU: all mean "not this way"
        return None
    if not handles:
        return None

    def read() -> float:
        return sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1000  # mJ
    return Meter(f"NVML total energy of {len(handles)} GPU(s) (the GPUs only, not the host)", read)


def meter(local: bool) -> Meter:
    if not local:
        return Meter("not read: the target runs elsewhere, and only this host's counters can be read", None)
    found = _nvml() or _rapl()
    if found is not None:
        return found
    return Meter(f"not read: this host exposes no RAPL counters ({POWERCAP} is absent or empty, as in most VMs and "
                 "containers) and no NVIDIA GPU", None)
