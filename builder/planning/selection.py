"""Choose a profile for a model on a target, NIM-style, and say why for every profile.

Each profile is runnable, compatible but low on memory (with what it needs), or incompatible (with
why). Runnable ones are ranked: optimized engine first, then the lowest precision that keeps
accuracy, then the mode asked for, then the most specific CPU class, then tensor parallelism
(throughput: the fewest GPUs that fit; latency: the most).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from builder.errors import InputError
from builder.model.catalog import ModelFacts, Task
from builder.planning.memory import USABLE_FRACTION, MemoryNeed, fits, memory_need
from builder.planning.precisions import PRECISIONS
from builder.planning.profiles import CPU_CLASSES, Profile
from builder.planning.target import Target

Status = Literal["runnable", "low_memory", "incompatible"]
ENGINE_RANK = {"tensorrt": 0, "onnxruntime": 1}
# Preferred first; the set may be chosen without being asked for. CPU language models: int8 first, 4.5x fp32's
# decode speed at batch 1 and 1.8x at 16 (docs/benchmarks/llm_kernels.md: int4 is faster at batch 1 and as
# fast at 16, with a ten times coarser rounding, so it is chosen when asked), then fp32;
# the build's gate decides, and a precision that fails it is passed over for the next (build/pipeline.py).
PRECISION_ORDER: dict[tuple[Task, str], tuple[tuple[str, ...], frozenset[str]]] = {
    ("text-generation", "gpu"): (("fp8", "bf16", "fp16", "int8", "nvfp4"), frozenset({"fp8", "bf16", "fp16"})),
    ("text-generation", "cpu"): (("int8", "fp32", "int4"), frozenset({"int8", "fp32"})),
    ("embedding", "gpu"): (("fp16", "bf16", "int8", "fp8"), frozenset({"fp16", "bf16"})),
    ("embedding", "cpu"): (("fp32", "int8"), frozenset({"fp32"})),
    ("rerank", "gpu"): (("fp16", "bf16", "int8", "fp8"), frozenset({"fp16", "bf16"})),
    ("rerank", "cpu"): (("fp32", "int8"), frozenset({"fp32"})),
}
# Why the first precision of the order is chosen, where it is not "the lowest that keeps accuracy".
PRECISION_WHY: dict[tuple[Task, str], str] = {
    ("text-generation", "cpu"): "the fastest that passes the build's gate (decode steps: int8 1.8-4.5x "
                                "fp32's; docs/llm.md)",
}
QUANTIZED = frozenset(name for name, info in PRECISIONS.items() if info.quantized)
DEFAULT_MODE: dict[Task, str] = {"text-generation": "throughput", "embedding": "latency", "rerank": "latency"}


class NoProfile(InputError):
    pass


@dataclass(frozen=True)
class Verdict:
    profile: Profile
    status: Status
    reasons: tuple[str, ...]
    need: MemoryNeed

    @property
    def needs_gb(self) -> float:
        return self.need.rounded_gb


@dataclass(frozen=True)
class Selection:
    verdicts: tuple[Verdict, ...]
    selected: Verdict | None
    why: tuple[str, ...]


def _incompatibilities(profile: Profile, target: Target) -> list[str]:
    gpu = target.gpu
    if profile.device == "gpu":
        if gpu is None:
            return [f"needs a GPU ({profile.hardware}); the target is a CPU"]
        reasons = []
        if profile.hardware != gpu.model:
            reasons.append(f"built for {profile.hardware}; the target GPU is {gpu.model}")
        need = PRECISIONS[profile.precision].min_compute_capability
        if need and gpu.cc < need:
            reasons.append(f"{profile.precision} needs sm_{need[0]}{need[1]} or newer; "
                           f"{gpu.model} is sm_{gpu.compute_capability.replace('.', '')}")
        if profile.tp > len(target.gpus):
            reasons.append(f"tp{profile.tp} needs {profile.tp} GPUs; the target has {len(target.gpus)}")
        if profile.match.min_gpu_memory_gb and gpu.memory_gb < profile.match.min_gpu_memory_gb:
            reasons.append(f"needs GPUs with >= {profile.match.min_gpu_memory_gb:g} GB")
        return reasons
    if gpu is not None:
        return [f"a CPU profile; the target is {len(target.gpus)}x {gpu.model}"]
    missing = sorted(set(profile.match.cpu_flags) - target.cpu_flags)
    return [f"needs CPU flags {', '.join(missing)}"] if missing else []


def evaluate(profile: Profile, target: Target, facts: ModelFacts) -> Verdict:
    need = memory_need(facts, profile)
    reasons = _incompatibilities(profile, target)
    if reasons:
        return Verdict(profile, "incompatible", tuple(reasons), need)
    available = target.gpu.memory_gb if target.gpu else target.ram_gb
    if not fits(need, available):
        usable = math.floor(available * USABLE_FRACTION * 10) / 10
        unit = (f"per GPU ({target.gpu.model} has {available:g} GB, {usable:g} usable)" if target.gpu
                else f"of RAM (host has {available:g} GB, {usable:g} usable)")
        return Verdict(profile, "low_memory", (f"needs >= {need.rounded_gb:g} GB {unit}",), need)
    return Verdict(profile, "runnable", (), need)


def _rank(verdict: Verdict, task: Task, mode: str, pinned_precision: bool) -> tuple[object, ...]:
    profile = verdict.profile
    order, keeps = PRECISION_ORDER[(task, profile.device)]
    tp_key = profile.tp if mode == "throughput" else -profile.tp
    # Quantized kernels gain from a newer CPU class; fp32 runs the same everywhere, so the baseline
    # class wins there and the image stays portable.
    specific = CPU_CLASSES.get(profile.hardware, 0)
    cpu_key = specific if profile.precision in QUANTIZED else -specific
    return (0 if pinned_precision or profile.precision in keeps else 1, ENGINE_RANK[profile.engine],
            order.index(profile.precision) if profile.precision in order else len(order),
            0 if profile.mode == mode else 1, cpu_key, tp_key, profile.name)


def _explain(verdict: Verdict, task: Task, mode: str, asked: dict[str, str | None], target: Target,
             failed: frozenset[str]) -> list[str]:
    p = verdict.profile
    if asked.get("profile"):
        return [f"profile {p.name}: asked for (--profile / MBUILD_PROFILE)"]
    lines = [f"engine {p.engine}: " + ("the optimized engine for this GPU" if p.engine == "tensorrt"
                                       else "ONNX Runtime, the CPU engine")]
    passed_over = f"; {', '.join(sorted(failed))} failed it on this model" if failed else ""
    why = PRECISION_WHY.get((task, p.device), f"the lowest that keeps accuracy for {task} here")
    lines.append(f"precision {p.precision}: " + ("asked for (--precision)" if asked.get("precision")
                 else why + passed_over))
    if asked.get("mode"):
        lines.append(f"mode {p.mode}: asked for (--mode)")
    elif p.mode == mode:
        lines.append(f"mode {p.mode}: the default for {task}")
    else:
        lines.append(f"mode {p.mode}: no {mode} profile (the default for {task}) fits here")
    if p.device == "cpu":
        lines.append(f"{p.hardware}: " + (
            "the most specific CPU class this host supports, for its quantized kernels" if p.precision in QUANTIZED
            else "fp32 runs the same on every CPU class; the baseline keeps the image portable"))
    elif len(target.gpus) > 1 or p.tp > 1:
        lines.append(f"tp{p.tp}: " + ("the fewest GPUs that fit, leaving the rest for replicas"
                                     if mode == "throughput" else "the most GPUs, for the lowest latency"))
    where = "per GPU" if p.device == "gpu" else "of RAM"
    need = verdict.need
    lines.append(f"memory: needs {verdict.needs_gb:g} GB {where} (weights {need.weights_gb:.1f}, "
                 f"KV cache {need.kv_cache_gb:.1f}, headroom {need.overhead_gb:.1f}); {need.start_gb:.1f} GB held from "
                 "start" + ((", the KV cache of max_batch sequences reserved then" if need.kv_start_gb else
                             ", the KV pool's pages committed as sequences fill them") if need.kv_cache_gb else ""))
    lines.append(f"build: needs {need.build_gb:.1f} GB of RAM and {need.build_disk_gb:.1f} GB of disk on the "
                 "build host (the checkpoint's download included)")
    return lines


def select(profiles: list[Profile], target: Target, facts: ModelFacts, *, profile: str | None = None,
           precision: str | None = None, mode: str | None = None,
           failed: frozenset[str] = frozenset()) -> Selection:
    """Evaluate every profile for the model's task; choose one (or None) honouring the user's asks.

    failed: precisions whose engines failed the gate on this model; the choice passes over them."""
    task = facts.task
    wanted_mode = mode or DEFAULT_MODE[task]
    verdicts = [evaluate(p, target, facts) for p in profiles if task in p.tasks]
    if profile:
        named = [v for v in verdicts if profile in {v.profile.name, v.profile.id} or
                 (len(profile) >= 12 and v.profile.id.startswith(profile))]
        if not named:
            raise NoProfile(f"no profile {profile!r} serves {task} models",
                            hint="list them with: mbuild profiles MODEL --gpu ...")
        chosen = named[0]
        if chosen.status != "runnable":
            raise NoProfile(f"profile {chosen.profile.name} cannot run on {target.describe()}: "
                            + "; ".join(chosen.reasons))
        candidates = [chosen]
    else:
        candidates = [v for v in verdicts if v.status == "runnable" and v.profile.precision not in failed
                      and (precision is None or v.profile.precision == precision)
                      and (mode is None or v.profile.mode == mode)]
    if failed:  # after a failed gate, only precisions chosen by default: never down to one less accurate
        candidates = [v for v in candidates if v.profile.precision in PRECISION_ORDER[(task, v.profile.device)][1]]
    ranked_runnable = sorted(candidates, key=lambda v: _rank(v, task, wanted_mode, precision is not None))
    others = sorted((v for v in verdicts if v not in ranked_runnable),
                    key=lambda v: ({"runnable": 0, "low_memory": 1, "incompatible": 2}[v.status],
                                   v.need.per_device_gb if v.status == "low_memory" else 0, v.profile.name))
    ordered = tuple(ranked_runnable + others)
    if not ranked_runnable:
        return Selection(ordered, None, ())
    best = ranked_runnable[0]
    asked = {"profile": profile, "precision": precision, "mode": mode}
    return Selection(ordered, best, tuple(_explain(best, task, wanted_mode, asked, target, failed)))


def require_selection(selection: Selection, target: Target, model: str, asked: str = "") -> Verdict:
    """The chosen verdict, or a NoProfile error naming the nearest miss and why it missed."""
    if selection.selected is not None:
        return selection.selected
    if not selection.verdicts:
        raise NoProfile(f"no profile serves {model}'s task", hint="add one under profiles/ or MBUILD_PROFILES_DIR")
    low = [v for v in selection.verdicts if v.status == "low_memory"]
    runnable = [v for v in selection.verdicts if v.status == "runnable"]
    if runnable and asked:
        nearest = runnable[0]
        raise NoProfile(f"no runnable profile for {model} on {target.describe()} matches {asked}",
                        hint=f"runnable instead: {nearest.profile.name}")
    same_kind = "gpu" if target.gpu else "cpu"
    nearest = min(low, key=lambda v: v.need.per_device_gb) if low else min(
        selection.verdicts, key=lambda v: (len(v.reasons), v.profile.device != same_kind, v.profile.name))
    more = "more or larger GPUs (--gpu NAMExN), or a lower precision" if low else "another --gpu or profile"
    raise NoProfile(f"no profile can run {model} on {target.describe()}; the nearest miss is "
                    f"{nearest.profile.name}: {'; '.join(nearest.reasons)}", hint=f"try {more}")
