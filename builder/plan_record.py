"""plan.json's contract for its readers: what `mbuild deploy`, `inspect` and the base check take from a plan.

A build directory's plan.json, `mbuild plan --json` and the image's dev.mbuild.deploy label all hold these
fields at the same paths (BuildPlan.record() writes the label, BuildPlan.to_dict() the full plan), each with
`"format": PLAN_FORMAT`. parse refuses another format and any missing or ill-typed field, naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtimes.bundle.codec import ContractError, bounds, check_format, decode, encode
from runtimes.bundle.engine import Task
from runtimes.bundle.metadata import Requirements

PLAN_FILE = "plan.json"
PLAN_FORMAT = 1
REWRITE_HINT = "write it again with this mbuild: `mbuild package` (a build directory) or `mbuild plan MODEL --json`"


@dataclass(frozen=True)
class PlannedModel:
    repo: str


@dataclass(frozen=True)
class PlannedLimits:
    max_batch: int = field(metadata=bounds(1, 4096))  # sequences per engine call: the autoscaler's target


@dataclass(frozen=True)
class PlannedContent:
    limits: PlannedLimits


@dataclass(frozen=True)
class PlannedProfile:
    id: str
    name: str
    content: PlannedContent


@dataclass(frozen=True)
class PlanRecord:
    tag: str
    task: Task
    model: PlannedModel
    profile: PlannedProfile
    requires: Requirements
    format: int = PLAN_FORMAT
    extras: tuple[str, ...] = ()  # optional parts of the image: "dynamo" runs as an NVIDIA Dynamo worker too

    @property
    def max_batch(self) -> int:
        return self.profile.content.limits.max_batch

    @classmethod
    def from_dict(cls, raw: object, source: str = PLAN_FILE) -> PlanRecord:
        check_format(raw, source, PLAN_FORMAT)
        return decode(cls, raw, source)

    @classmethod
    def parse(cls, text: str, source: str = PLAN_FILE) -> PlanRecord:
        """ContractError when text is not JSON, or not a plan of this format."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ContractError(f"{source} is not JSON ({exc})") from exc
        return cls.from_dict(raw, source)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        if not self.extras:  # a plan without extras reads as before they existed (labels, goldens unchanged)
            del data["extras"]
        return data
