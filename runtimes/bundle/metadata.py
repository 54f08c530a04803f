"""metadata.json: what the image is (model, profile, versions) and what its host must have (Requirements).

Written by the builder's context stage from the plan; read by the runtime's /v1/metadata, /v1/manifest,
served names, profile choice and its start-up hardware check. Requirements is also the `requires` of plan.json
and of the image's deploy label, so one type says what a host needs wherever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from runtimes.bundle.codec import bounds, check_format, decode, encode

METADATA_FILE = "metadata.json"
DRAFT_DIR = "draft"  # a draft model's engine folder, inside the model folder (mbuild package --draft)
METADATA_FORMAT = 1
MAX_MEMORY_GB = 65536.0  # 64 TB: above any host; a bigger need is a corrupt file, not a model


@dataclass(frozen=True)
class Requirements:
    """What the serving host must have; the container checks it at start and deploy sizes pods by it."""

    device: Literal["cpu", "gpu"]
    cpu_flags: tuple[str, ...]
    memory_gb: float = field(metadata=bounds(0, MAX_MEMORY_GB))
    python: str
    gpus: int = field(metadata=bounds(0, 1024))  # 0 on CPUs
    compute_capabilities: tuple[str, ...]  # one per engine the image carries; empty on CPUs
    gpu_models: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data


@dataclass(frozen=True)
class ModelInfo:
    repo: str
    revision: str
    sha: str | None  # None for a local folder
    alias: str | None


@dataclass(frozen=True)
class ProfileInfo:
    id: str
    name: str
    engine: str
    precision: str
    mode: str


@dataclass(frozen=True)
class BundleMetadata:
    model: ModelInfo
    profile: ProfileInfo
    image: str  # the tag it was built as
    plan_digest: str
    versions: dict[str, str]  # the build's tools
    requires: Requirements
    # The speculative-decoding draft model carried in DRAFT_DIR, if any. Optional, so no format bump: an image
    # carries the runtime that reads it, and a reader that predates it serves the target alone.
    draft: ModelInfo | None = None
    format: int = METADATA_FORMAT

    @classmethod
    def from_dict(cls, raw: object) -> BundleMetadata:
        check_format(raw, METADATA_FILE, METADATA_FORMAT)
        return decode(cls, raw, METADATA_FILE)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data
