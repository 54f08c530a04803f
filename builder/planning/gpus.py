"""NVIDIA GPUs mbuild knows by name (profiles/gpus.yaml): `--gpu NAME[xN]` and NVML name mapping."""

from __future__ import annotations

import re
from functools import cache

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from builder.errors import InputError
from builder.resources import resource_dir

_SPEC = re.compile(r"^(?P<name>[a-z0-9][a-z0-9-]*?)(?:x(?P<count>[1-9][0-9]?))?$")


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    compute_capability: str
    memory_gb: float
    nvml: tuple[str, ...]

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


@cache
def known_gpus() -> dict[str, GpuModel]:
    path = resource_dir("profiles") / "gpus.yaml"
    raw = yaml.safe_load(path.read_text()) or {}
    try:
        return {name: GpuModel.model_validate({**entry, "name": name}) for name, entry in raw["gpus"].items()}
    except (ValidationError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: invalid GPU table: {exc}") from exc


def identify(nvml_name: str) -> GpuModel | None:
    """The known model an NVML device name stands for: the longest matching pattern wins."""
    best: tuple[int, GpuModel] | None = None
    for gpu in known_gpus().values():
        for pattern in gpu.nvml:
            if pattern.lower() in nvml_name.lower() and (best is None or len(pattern) > best[0]):
                best = (len(pattern), gpu)
    return best[1] if best else None


def parse_gpu_spec(spec: str) -> tuple[GpuModel, int]:
    """'h100' -> (h100, 1); 'h100x2' -> (h100, 2); 'a100-40gb' -> (a100-40gb, 1)."""
    text = spec.strip().lower()
    gpus = known_gpus()
    if text in gpus:
        return gpus[text], 1
    match = _SPEC.match(text)
    if match and match["name"] in gpus:
        return gpus[match["name"]], int(match["count"] or 1)
    raise InputError(f"unknown GPU {spec!r}",
                     hint=f"use cpu, or one of {', '.join(gpus)}, optionally with a count: h100x2")
