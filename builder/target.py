"""The hardware a build is for: detected on this host, or named with --gpu."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builder.errors import InputError

# CPU features that change which ONNX Runtime kernels run (MLAS picks them at run time).
CPU_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "9.0"
    memory_gb: float


@dataclass(frozen=True)
class Target:
    kind: Literal["cpu", "cuda"]
    gpus: tuple[Gpu, ...] = ()
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    ram_gb: float = 0.0
    cpu_count: int = 1

    def describe(self) -> str:
        if self.kind == "cpu":
            flags = ",".join(sorted(f for f in self.cpu_flags if f in CPU_FLAGS_OF_INTEREST)) or "baseline x86-64"
            return f"cpu ({self.cpu_count} cores, {self.ram_gb:.0f} GB RAM, {flags})"
        gpu = self.gpus[0]
        return f"{len(self.gpus)}x {gpu.name} (sm_{gpu.compute_capability.replace('.', '')}, {gpu.memory_gb:.0f} GB)"

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "gpus": [{"name": g.name, "compute_capability": g.compute_capability, "memory_gb": g.memory_gb}
                     for g in self.gpus],
            "cpu_flags": sorted(f for f in self.cpu_flags if f in CPU_FLAGS_OF_INTEREST),
        }


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def read_ram_gb(meminfo: Path = Path("/proc/meminfo")) -> float:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


def host_cpu_target() -> Target:
    return Target(kind="cpu", cpu_flags=read_cpu_flags(), ram_gb=read_ram_gb(), cpu_count=os.cpu_count() or 1)


def resolve_target(gpu: str | None) -> Target:
    """`--gpu cpu` (or nothing, on a host without GPUs) builds for this host's CPU."""
    if gpu is None or gpu.strip().lower() in {"", "cpu", "auto"}:
        return host_cpu_target()
    raise InputError(f"--gpu {gpu!r}: GPU targets are not supported by this build of mbuild yet",
                     hint="use --gpu cpu")
