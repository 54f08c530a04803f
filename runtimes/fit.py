"""At container start: does this host have what the image's profile was built for?

A TensorRT engine is bound to its compute capability, and a quantized CPU engine may use CPU
features the host lacks; serving anyway would fail later and less clearly, so the container
refuses at start, says why, and exits non-zero (readiness is never 200).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runtimes.bundle.metadata import Requirements
from runtimes.hardware import GpuInfo, read_ram_gb

_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def memory_limit_gb() -> float:
    """The smaller of the host's RAM and the container's cgroup memory limit."""
    ram = read_ram_gb()
    for path in _CGROUP_LIMITS:
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            ram = min(ram, int(raw) / 1024**3) if ram else int(raw) / 1024**3
    return round(ram, 1)


def misfits(requires: Requirements, cpu_flags: frozenset[str], gpus: Sequence[GpuInfo],
            memory_gb: float) -> list[str]:
    problems = []
    missing = sorted(set(requires.cpu_flags) - cpu_flags)
    if missing:
        problems.append(f"the engine was built for CPUs with {', '.join(missing)}, which this host lacks; "
                        "rebuild on (or for) this CPU class, e.g. mbuild package MODEL --gpu cpu")
    needed = requires.memory_gb
    if requires.device == "gpu":
        count = requires.gpus
        ccs = list(requires.compute_capabilities)
        models = ", ".join(requires.gpu_models) or "GPU"
        if len(gpus) < count:
            problems.append(f"the engine needs {count} NVIDIA GPU(s) ({models}, compute capability "
                            f"{' or '.join(ccs)}); {len(gpus)} visible (run with --gpus all and the NVIDIA container "
                            "toolkit)")
        for gpu in gpus[:count]:
            if ccs and gpu.compute_capability not in ccs:
                problems.append(f"the engines were built for compute capability {' and '.join(ccs)} ({models}); "
                                f"{gpu.name} is {gpu.compute_capability}: rebuild with mbuild package MODEL --gpu "
                                "<this GPU>, or package several: --gpu h100,l40s")
            if needed and gpu.memory_gb < needed:
                problems.append(f"the profile needs {needed:g} GB per GPU; {gpu.name} has {gpu.memory_gb:g} GB")
    elif needed and memory_gb and memory_gb < needed:
        problems.append(f"the profile needs {needed:g} GB of memory; this container may use {memory_gb:g} GB")
    return problems
