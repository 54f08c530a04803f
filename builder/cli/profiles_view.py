"""Text for `mbuild profiles`: runnable / low memory / incompatible, NIM's list-model-profiles style."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from builder.model.catalog import ModelFacts
from builder.planning.selection import Selection, Verdict
from builder.planning.target import Target

_OTHER_GPU = re.compile(r"^built for (?P<gpu>[^;]+); the target GPU is ")
_NEEDS_GPU = re.compile(r"^needs a GPU \((?P<gpu>[^)]+)\); the target is a CPU$")
_CPU_ON_GPU = re.compile(r"^a CPU profile; the target is ")


def _row(verdict: Verdict, selected: Verdict | None, note: str, width: int) -> str:
    mark = "*" if verdict is selected else " "
    return f"  {mark} {verdict.profile.name:<{width}}  {verdict.profile.id[:12]}  {note}".rstrip()


_GROUP_AT = 4  # this many incompatible profiles with one same reason are summed up in one line


def _collapse(incompatible: list[Verdict]) -> tuple[list[str], list[Verdict]]:
    """Sum up profiles for other hardware, and any reason many profiles share, in one line each."""
    other_gpus: dict[str, int] = defaultdict(int)
    cpu_profiles = 0
    rest = []
    for verdict in incompatible:
        first = verdict.reasons[0]
        if m := _OTHER_GPU.match(first) or _NEEDS_GPU.match(first):
            other_gpus[m["gpu"]] += 1
        elif _CPU_ON_GPU.match(first):
            cpu_profiles += 1
        else:
            rest.append(verdict)
    by_reason: dict[str, list[Verdict]] = defaultdict(list)
    for verdict in rest:
        by_reason["; ".join(verdict.reasons)].append(verdict)
    lines = [f"    {len(group)} profiles: {reason}" for reason, group in by_reason.items() if len(group) >= _GROUP_AT]
    rest = [v for group in by_reason.values() if len(group) < _GROUP_AT for v in group]
    if other_gpus:
        count = sum(other_gpus.values())
        lines.append(f"    {count} profiles for other hardware: {', '.join(sorted(other_gpus))}")
    if cpu_profiles:
        lines.append(f"    {cpu_profiles} CPU profiles: the target has GPUs")
    return lines, rest


def render_profiles(model: str, facts: ModelFacts, target: Target, selection: Selection,
                    every_row: bool = False) -> str:
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for verdict in selection.verdicts:
        groups[verdict.status].append(verdict)
    unit = "GB per GPU" if target.gpu else "GB of RAM"
    collapsed, rest = ([], groups["incompatible"]) if every_row else _collapse(groups["incompatible"])
    width = max((len(v.profile.name) for v in [*groups["runnable"], *groups["low_memory"], *rest]), default=0)
    out = [f"Profiles for {model} ({facts.task}, {facts.describe_params()}) on {target.describe()}", ""]
    out.append("Compatible and runnable:")
    out += [_row(v, selection.selected, f"needs {v.needs_gb:g} {unit}; build {v.need.build_gb:.1f} GB RAM, "
                 f"{v.need.build_disk_gb:.0f} GB disk", width) for v in groups["runnable"]] or ["    none"]
    out.append("Compatible but low memory:")
    out += [_row(v, None, v.reasons[0], width) for v in groups["low_memory"]] or ["    none"]
    out.append("Incompatible:")
    out += [_row(v, None, "; ".join(v.reasons), width) for v in rest] + collapsed or ["    none"]
    out.append("")
    if selection.selected is None:
        out.append("Selected: none (no profile can run this model on this target)")
    else:
        out.append(f"Selected: {selection.selected.profile.name}")
        out += [f"  - {line}" for line in selection.why]
    return "\n".join(out) + "\n"


def profiles_json(model: str, facts: ModelFacts, target: Target, selection: Selection) -> dict[str, Any]:
    return {
        "model": model,
        "facts": facts.model_dump(mode="json"),
        "target": target.as_dict(),
        "selected": selection.selected.profile.name if selection.selected else None,
        "why": list(selection.why),
        "profiles": [{"name": v.profile.name, "id": v.profile.id, "status": v.status, "reasons": list(v.reasons),
                      "needs_gb_per_device": v.needs_gb, "start_gb": round(v.need.start_gb, 2),
                      "build_gb": round(v.need.build_gb, 2), "build_disk_gb": round(v.need.build_disk_gb, 2),
                      "selected": v is selection.selected}
                     for v in selection.verdicts],
    }
