"""The hardware a build is for: detected on this host, or named with --gpu."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from builder.errors import InputError
from builder.planning.gpus import identify, parse_gpu_spec
from runtimes.hardware import GpuInfo, cpu_count, detect_gpus, read_cpu_flags, read_ram_gb

# CPU features that change which ONNX Runtime kernels run (MLAS picks them at run time).
CPU_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class Gpu:
    model: str  # the short name profiles use (h100, l4, ...), or a slug of an unknown device's name
    compute_capability: str
    memory_gb: float
    device_name: str = ""

    @property
    def cc(self) -> tuple[int, int]:
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)


@dataclass(frozen=True)
class Target:
    kind: Literal["cpu", "cuda"]
    gpus: tuple[Gpu, ...] = ()
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    ram_gb: float = 0.0
    cpu_count: int = 1
    source: str = "detected"  # or "--gpu h100x2"

    @property
    def gpu(self) -> Gpu | None:
        return self.gpus[0] if self.gpus else None

    def describe(self) -> str:
        if self.gpu is None:
            flags = ",".join(sorted(f for f in self.cpu_flags if f in CPU_FLAGS_OF_INTEREST)) or "baseline x86-64"
            return f"cpu ({self.cpu_count} cores, {self.ram_gb:.0f} GB RAM, {flags})"
        g = self.gpu
        return f"{len(self.gpus)}x {g.model} (sm_{g.compute_capability.replace('.', '')}, {g.memory_gb:g} GB)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "gpus": [{"model": g.model, "compute_capability": g.compute_capability, "memory_gb": g.memory_gb}
                     for g in self.gpus],
            "cpu_flags": sorted(f for f in self.cpu_flags if f in CPU_FLAGS_OF_INTEREST),
            "ram_gb": self.ram_gb,
        }


def host_cpu_target(source: str = "detected") -> Target:
    return Target(kind="cpu", cpu_flags=read_cpu_flags(), ram_gb=read_ram_gb(), cpu_count=cpu_count(),
                  source=source)


def gpu_from_device(info: GpuInfo) -> Gpu:
    known = identify(info.name)
    model = known.name if known else re.sub(r"[^a-z0-9]+", "-", info.name.lower().replace("nvidia", "")).strip("-")
    return Gpu(model=model, compute_capability=info.compute_capability, memory_gb=info.memory_gb,
               device_name=info.name)


def detected_target(gpus: tuple[GpuInfo, ...] | None = None) -> Target:
    """NVML's GPUs when there are any, else this host's CPU. No driver is a CPU host, not an error."""
    found = detect_gpus() if gpus is None else gpus
    if not found:
        return host_cpu_target()
    cpu = host_cpu_target()
    return Target(kind="cuda", gpus=tuple(gpu_from_device(g) for g in found), cpu_flags=cpu.cpu_flags,
                  ram_gb=cpu.ram_gb, cpu_count=cpu.cpu_count)


def resolve_target(spec: str | None) -> Target:
    """`--gpu`: nothing or 'auto' detects; 'cpu' is this host's CPU; 'h100x2' names other hardware."""
    text = (spec or "auto").strip().lower()
    if text in {"", "auto"}:
        return detected_target()
    if text == "cpu":
        return host_cpu_target(source="--gpu cpu")
    if "," in text:
        raise InputError(f"--gpu {spec!r} names several GPUs where one is expected", hint="e.g. --gpu h100x2")
    model, count = parse_gpu_spec(text)
    cpu = host_cpu_target()
    gpu = Gpu(model=model.name, compute_capability=model.compute_capability, memory_gb=model.memory_gb)
    return Target(kind="cuda", gpus=(gpu,) * count, cpu_flags=cpu.cpu_flags, ram_gb=cpu.ram_gb,
                  cpu_count=cpu.cpu_count, source=f"--gpu {text}")


def resolve_targets(spec: str | None) -> list[Target]:
    """`--gpu h100,l40s`: one target per GPU model, for an image that carries an engine for each."""
    parts = [p.strip() for p in (spec or "auto").split(",") if p.strip()] or ["auto"]
    targets = [resolve_target(p) for p in parts]
    if len(targets) > 1 and any(t.kind != "cuda" for t in targets):
        raise InputError(f"--gpu {spec!r}: several targets must all be GPUs", hint="e.g. --gpu h100,l40s")
    models = [t.gpu.model for t in targets if t.gpu]
    if len(set(models)) != len(models):
        raise InputError(f"--gpu {spec!r} names a GPU twice", hint="use NAMExN for several of one kind: h100x2")
    return targets
