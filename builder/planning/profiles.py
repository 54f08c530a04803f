"""Optimization profiles (profiles/*.yaml): validated, expanded, identified by content.

A file lists entries; an entry may carry a `matrix` (lists of values for precision, mode, tp)
that expands into one profile per combination, and `variants` ("field=value": overrides) that
apply to the combinations they name. Every problem in every file is collected and reported at once.
"""

from __future__ import annotations

import copy
import itertools
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.errors import InputError
from builder.hashing import sha256_json
from builder.model.catalog import Task
from builder.planning.engine_options import option_problems
from builder.planning.gpus import known_gpus
from builder.planning.precisions import CPU_PRECISIONS, PRECISIONS, Precision
from builder.resources import resource_dir
from builder.settings import host_settings
from runtimes.bundle.engine import DEFAULT_MAX_BATCH

DEFAULT_BASE_IMAGE = "python:3.11-slim"
CPU_CLASSES = {"cpu": 2, "cpu.avx512": 1, "cpu.vnni": 0}  # value: rank, most specific first
# Precisions that need newer tensor cores: (major, minor) compute capability.
_MATRIX_KEYS = ("precision", "mode", "tp")
_NOT_DATA = {"catalog.yaml", "gpus.yaml", "prices.yaml"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    cpu_flags: tuple[str, ...] = ()
    min_gpu_memory_gb: float | None = Field(None, gt=0)


class Limits(_Strict):
    max_batch: int = Field(DEFAULT_MAX_BATCH, ge=1, le=4096,
                           description="sequences per engine call (and concurrent sequences)")
    max_batch_delay_ms: float = Field(2, ge=0, le=1000)
    context: int | None = Field(None, ge=16, description="tokens reserved per sequence for the KV cache")


class Tolerance(_Strict):
    """The numerical gate. Embeddings: cosine to the reference. Rerankers: the score's (logit's) largest
    difference from the reference. Language models: greedy decode equal to transformers token by token, or
    (greedy_exact false) teacher-forced top-1 agreement and logit error."""

    min_cosine: float = Field(0.9999, gt=0, le=1)
    greedy_exact: bool = True
    min_top1: float = Field(0.9, gt=0, le=1)
    max_logit_error: float | None = Field(None, gt=0)
    max_score_error: float = Field(1e-3, gt=0)


class Profile(_Strict):
    engine: Literal["onnxruntime", "tensorrt"]
    hardware: str = Field(description="cpu, cpu.avx512, cpu.vnni, or a GPU from profiles/gpus.yaml")
    precision: Precision
    mode: Literal["latency", "throughput"] = "latency"
    tp: Literal[1, 2, 4, 8] = 1
    tasks: tuple[Task, ...]
    match: Match = Match()
    limits: Limits = Limits()
    base_image: str = DEFAULT_BASE_IMAGE
    python_version: str = "3.11"
    engine_options: dict[str, str | int | float | bool] = {}
    tolerance: Tolerance = Tolerance()

    @cached_property
    def id(self) -> str:
        return sha256_json(self.model_dump(mode="json"))

    @property
    def name(self) -> str:
        return f"{self.engine}-{self.hardware}-{self.precision}-tp{self.tp}-{self.mode}"

    @property
    def device(self) -> Literal["cpu", "gpu"]:
        return "cpu" if self.hardware in CPU_CLASSES else "gpu"


class ProfileSetError(InputError):
    """Every problem found in the profile files, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the profiles:\n  " + "\n  ".join(problems),
                         hint="fix the files named above; allowed values are listed with each problem")
        self.problems = problems


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(
            merged.get(key), dict) else copy.deepcopy(value)
    return merged


def _expand(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, raw profile) for each combination of the entry's matrix, variants applied."""
    entry = dict(entry)
    matrix = entry.pop("matrix", None) or {}
    variants = entry.pop("variants", None) or {}
    if not isinstance(matrix, dict) or not isinstance(variants, dict):
        raise ValueError("'matrix' and 'variants' must be mappings")
    unknown = set(matrix) - set(_MATRIX_KEYS)
    if unknown:
        raise ValueError(f"matrix keys {sorted(unknown)} are not allowed; allowed: {list(_MATRIX_KEYS)}")
    keys = [k for k in _MATRIX_KEYS if k in matrix]
    out = []
    for values in itertools.product(*(matrix[k] if isinstance(matrix[k], list) else [matrix[k]] for k in keys)):
        combo = dict(zip(keys, values, strict=True))
        raw = {**entry, **combo}
        for selector, override in variants.items():
            field, _, wanted = str(selector).partition("=")
            if field not in raw and field not in combo:
                raise ValueError(f"variant {selector!r} names no field of the entry")
            if str(raw.get(field)) == wanted:
                raw = _merge(raw, override)
        label = ", ".join(f"{k}={v}" for k, v in combo.items())
        out.append((label, raw))
    return out


def _describe(error: dict[str, Any], allowed_fields: list[str]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "entry"
    if error.get("type") == "extra_forbidden":
        return f"field {where!r} is not allowed (allowed: {', '.join(allowed_fields)})"
    return f"field {where!r}: {error.get('msg')} (got {error.get('input')!r})"


def _semantic_problems(profile: Profile) -> list[str]:
    problems = []
    gpus = known_gpus()
    if profile.device == "cpu":
        if profile.engine != "onnxruntime":
            problems.append(f"engine {profile.engine} does not run on {profile.hardware}")
        if profile.tp != 1:
            problems.append("tensor parallelism needs GPUs: tp must be 1 on a CPU")
        if not PRECISIONS[profile.precision].cpu:
            problems.append(f"precision {profile.precision} is not a CPU precision ({', '.join(CPU_PRECISIONS)})")
    elif profile.hardware not in gpus:
        problems.append(f"hardware {profile.hardware!r} is unknown; allowed: "
                        f"{', '.join([*CPU_CLASSES, *gpus])}")
    else:
        gpu = gpus[profile.hardware]
        need = PRECISIONS[profile.precision].min_compute_capability
        have = tuple(int(x) for x in gpu.compute_capability.split("."))
        if need and have < need:
            problems.append(f"{profile.precision} needs compute capability >= {need[0]}.{need[1]}; "
                            f"{profile.hardware} is {gpu.compute_capability}")
    if profile.precision == "int4" and profile.tasks != ("text-generation",):
        problems.append("int4 is for language models only: tasks must be [text-generation]")
    return problems + option_problems(profile.engine, profile.engine_options)


def load_profiles(folders: list[Path] | None = None) -> list[Profile]:
    """All profiles of the built-in set plus MBUILD_PROFILES_DIR, or of the given folders."""
    if folders is None:
        folders = [resource_dir("profiles")]
        extra = host_settings().profiles_dir
        if extra:
            folders.append(extra)
    problems: list[str] = []
    profiles: list[Profile] = []
    seen: dict[str, str] = {}
    fields = [*Profile.model_fields, "matrix", "variants"]
    for path in sorted(p for folder in folders for p in folder.glob("*.yaml") if p.name not in _NOT_DATA):
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            problems.append(f"{path.name}: not valid YAML: {exc}")
            continue
        entries = raw.get("profiles") if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            problems.append(f"{path.name}: needs a top-level 'profiles:' list")
            continue
        # Top-level keys other than profiles hold YAML anchors and must say so with an x- prefix.
        stray = [k for k in raw if k != "profiles" and not str(k).startswith("x-")]
        if stray:
            problems.append(f"{path.name}: top-level keys {stray} are not allowed (profiles, or x-* for anchors)")
        for index, entry in enumerate(entries):
            where = f"{path.name}: profiles[{index}]"
            try:
                expanded = _expand(entry if isinstance(entry, dict) else {})
            except (ValueError, TypeError) as exc:
                problems.append(f"{where}: {exc}")
                continue
            for label, data in expanded:
                at = f"{where}{f' ({label})' if label else ''}"
                try:
                    profile = Profile.model_validate(data)
                except ValidationError as exc:
                    problems += [f"{at}: {_describe(dict(e), fields)}" for e in exc.errors()]
                    continue
                problems += [f"{at}: {p}" for p in _semantic_problems(profile)]
                if profile.name in seen:
                    problems.append(f"{at}: profile {profile.name} is already defined at {seen[profile.name]}")
                seen.setdefault(profile.name, at)
                profiles.append(profile)
    if problems:
        raise ProfileSetError(problems)
    return profiles
