"""The model bundle a build ships: engine files beside engine.json, metadata.json and report.json.

Each file is a typed, versioned contract (engine.py, metadata.py, report.py, tensorrt.py for each TensorRT
engine's engine-meta.json), read here for the runtime:
another format, or a missing or ill-typed field, is a BundleError that names the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from runtimes.bundle.codec import ContractError
from runtimes.bundle.engine import (
    DEFAULT_MAX_BATCH,
    ENGINE_FILE,
    Batching,
    DecoderOptions,
    EncoderOptions,
    EngineConfig,
)
from runtimes.bundle.metadata import METADATA_FILE, BundleMetadata, Requirements
from runtimes.bundle.report import REPORT_FILE, GateReport, read_gate_report
from runtimes.bundle.tensorrt import ENGINE_META_FILE, EngineMeta

__all__ = ["DEFAULT_MAX_BATCH", "ENGINE_FILE", "ENGINE_META_FILE", "METADATA_FILE", "REPORT_FILE", "Batching",
           "BundleError", "BundleMetadata", "DecoderOptions", "EncoderOptions", "EngineConfig", "EngineMeta",
           "GateReport", "Requirements", "load_engine_config", "load_engine_meta", "load_metadata", "load_report",
           "read_json"]
T = TypeVar("T")
REBUILD = "rebuild the image (or build directory) with the mbuild this runtime came with"
REBUILD_ENGINE = ("rebuild the engine for this GPU with the mbuild this runtime came with "
                  "(mbuild package MODEL --gpu <this GPU>)")


class BundleError(Exception):
    """The model folder is missing, incomplete or corrupt."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise BundleError(f"{path.name} is missing from the model folder {path.parent}") from exc
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{path} does not hold a JSON object")
    return data


def _contract(path: Path, reader: Callable[[dict[str, Any]], T], advice: str = REBUILD) -> T:
    try:
        return reader(read_json(path))
    except ContractError as exc:
        raise BundleError(f"{exc}; {advice}") from exc


def load_engine_config(model_dir: Path) -> EngineConfig:
    return _contract(model_dir / ENGINE_FILE, EngineConfig.from_dict)


def load_metadata(model_dir: Path) -> BundleMetadata | None:
    """metadata.json (model, profile, versions, what the host needs); None where a bundle has none (the gate's)."""
    path = model_dir / METADATA_FILE
    return _contract(path, BundleMetadata.from_dict) if path.is_file() else None


def load_report(model_dir: Path) -> GateReport | None:
    """report.json, the build's numerical gate; None where the bundle has none (never validated)."""
    path = model_dir / REPORT_FILE
    return _contract(path, read_gate_report) if path.is_file() else None


def load_engine_meta(path: Path, name: str) -> EngineMeta:
    """One TensorRT engine's engine-meta.json; name is how errors call it (engines/sm_90/engine-meta.json)."""
    return _contract(path, lambda raw: EngineMeta.from_dict(raw, name), REBUILD_ENGINE)
