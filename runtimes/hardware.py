"""What this host has: CPU flags and RAM from /proc, NVIDIA GPUs from NVML.

Used inside the container (to refuse a profile the hardware cannot run) and by the builder
(to detect the build target), so both read the hardware the same way.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str  # "9.0"
    memory_gb: float


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def read_ram_gb(meminfo: Path = Path("/proc/meminfo"), key: str = "MemTotal") -> float:
    """GiB of RAM: the host's total, or with key="MemAvailable" what it can give now."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return round(int(line.split()[1]) / (1024 * 1024), 1)
    except OSError:
        pass
    return 0.0


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def detect_gpus(nvml: Any = None) -> tuple[GpuInfo, ...]:
    """GPUs as NVML reports them; none (not an error) when there is no driver or no library."""
    if nvml is None:
        try:  # imported here, not at the top: a CPU bundle's start never asks (20 ms of it); nvidia-ml-py comes
            import pynvml  # with bentoml, and a host or image without it simply has no GPUs to report
        except ImportError:  # pragma: no cover
            return ()
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: a host without NVIDIA GPUs
        return ()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / (1024**3)
            gpus.append(GpuInfo(name=name, compute_capability=f"{major}.{minor}", memory_gb=round(memory, 1)))
        return tuple(gpus)
    except Exception:  # a broken driver is reported as no usable GPU rather than a crash
        return ()
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
