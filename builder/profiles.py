"""Optimization profiles (profiles/*.yaml): validated, identified by content, matched to a target."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.catalog import Task
from builder.errors import InputError
from builder.hashing import sha256_json
from builder.resources import resource_dir
from builder.target import Target

Precision = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4", "nvfp4"]
DEFAULT_BASE_IMAGE = "python:3.11-slim"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    cpu_flags: tuple[str, ...] = ()
    min_compute_capability: float | None = None
    max_compute_capability: float | None = None
    min_gpu_memory_gb: float | None = None


class Limits(_Strict):
    max_batch: int = Field(32, ge=1, le=4096)
    max_batch_delay_ms: float = Field(2, ge=0, le=1000)
    max_seq: int | None = Field(None, ge=1)


class Tolerance(_Strict):
    min_cosine: float = Field(0.9999, gt=0, le=1)


class Profile(_Strict):
    engine: Literal["onnxruntime", "tensorrt"]
    device: Literal["cpu", "gpu"]
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
        return f"{self.engine}-{self.device}-{self.precision}-tp{self.tp}-{self.mode}"


def load_profiles(folder: Path | None = None) -> list[Profile]:
    folder = folder or resource_dir("profiles")
    profiles: list[Profile] = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name == "catalog.yaml":
            continue
        raw = yaml.safe_load(path.read_text()) or {}
        for index, entry in enumerate(raw.get("profiles", [])):
            try:
                profiles.append(Profile.model_validate(entry))
            except ValidationError as exc:
                raise InputError(f"{path.name}: profiles[{index}] is invalid:\n{exc}") from exc
    return profiles


def select_profile(profiles: list[Profile], target: Target, task: Task) -> Profile:
    for profile in profiles:
        if task not in profile.tasks:
            continue
        if profile.device == "cpu" and target.kind == "cpu":
            missing = set(profile.match.cpu_flags) - target.cpu_flags
            if not missing:
                return profile
    raise InputError(f"no profile for a {task} model on {target.describe()}",
                     hint="see profiles/*.yaml for what each profile needs")
