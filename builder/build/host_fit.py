"""Whether this host can build the plan's engine: RAM before the download, disk before the export.

Refusing up front, with the numbers, beats the OOM killer ending a build an hour in (or a full disk
ending it half-written). The needs come from the plan (builder/planning/memory.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from builder.errors import InputError
from builder.planning.memory import USABLE_FRACTION
from builder.planning.plan import BuildPlan
from builder.settings import host_settings
from runtimes.hardware import read_ram_gb

SKIP = "MBUILD_BUILD_CHECK"  # =0 builds anyway (the estimate is an estimate)
GIB = 1024**3


def _skipped() -> bool:
    return not host_settings().build_check


def check_memory(plan: BuildPlan) -> None:
    available = read_ram_gb(key="MemAvailable") * GIB / 1e9
    need = plan.need.build_gb
    if _skipped() or not available or need <= available * USABLE_FRACTION:
        return
    raise InputError(
        f"building {plan.model.repo} with {plan.profile.name} needs about {need:.1f} GB of RAM; this host has "
        f"{available:.1f} GB available",
        hint=f"free memory, build on a larger host, or pick a profile that builds in less (`mbuild profiles MODEL "
             f"--gpu ...` shows each one's build need); {SKIP}=0 builds anyway")


def check_disk(plan: BuildPlan, build_dir: Path) -> None:
    free = shutil.disk_usage(build_dir).free / 1e9
    need = plan.need.weights_gb
    if _skipped() or need <= free:
        return
    raise InputError(f"the {plan.profile.precision} engine of {plan.model.repo} takes about {need:.1f} GB; "
                     f"{build_dir} has {free:.1f} GB free",
                     hint=f"free disk space or choose another --output; {SKIP}=0 builds anyway")
