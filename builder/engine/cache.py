"""Validated engines kept by what decides them, so a change that cannot alter the engine rebuilds none.

A new image name or version, a base image, or an ONNX Runtime profile that differs only in its batching
limits (latency vs throughput mode) gives a new plan but the same engine: export, compile and the
numerical gate are skipped, and the cached engine (with its gate report) is copied in. TensorRT engines
bake batch and sequence ranges into the plan file, so their limits stay in the key. The cache lives
in MBUILD_ENGINE_CACHE, else MBUILD_CACHE/engines (default ~/.cache/mbuild/engines); deleting it is
always safe.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from builder.hashing import sha256_json, tree_digest
from builder.planning.plan import BuildPlan
from builder.settings import host_settings
from runtimes.bundle.codec import ContractError, write_contract
from runtimes.bundle.engine import ENGINE_FILE, EngineConfig
from runtimes.bundle.report import REPORT_FILE, GateReport, read_gate_report

COMPLETE = ".complete"


def engine_key(plan: BuildPlan) -> str | None:
    """The digest of everything the engine and its gate report depend on; None when that is unknown."""
    if plan.model.sha is None:
        return None
    profile = plan.profile.model_dump(mode="json")
    for name in ("mode", "base_image", "python_version"):
        profile.pop(name)
    if profile["engine"] == "onnxruntime":
        limits = profile.pop("limits")
        if plan.task == "text-generation":
            profile["context"] = limits["context"]  # it caps the engine's max_seq_length
    return sha256_json({
        "model": {"repo": plan.model.repo, "sha": plan.model.sha, "files": list(plan.model.files)},
        "task": plan.task, "profile": profile,
        "engines": [(e.compute_capability, e.profile.id) for e in plan.engines],
        "runtime": plan.runtime_code, "tools": dict(plan.tools),
        "engine_code": tree_digest(Path(__file__).parent),  # builder/engine/: the code that decides engines
    })


def _folder(key: str) -> Path:
    return host_settings().engine_cache / key


def cached(key: str | None) -> Path | None:
    if key is None:
        return None
    folder = _folder(key)
    return folder if (folder / COMPLETE).is_file() else None


def _link_or_copy(source: str, target: str) -> None:
    """Hard links cost no space for multi-GB engines; a copy where links cannot cross filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def store(key: str | None, engine_dir: Path) -> None:
    """Keep a validated engine folder (engine.json and report.json included) under its key."""
    if key is None or cached(key):
        return
    folder = _folder(key)
    partial = folder.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(engine_dir, partial, copy_function=_link_or_copy)
    (partial / COMPLETE).touch()
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # atomic: a reader sees the whole engine or none


def restore(hit: Path, engine_dir: Path, plan: BuildPlan) -> GateReport | None:
    """Copy a cached engine into engine_dir with this plan's batching (read by the runtime only, so it may differ
    between a cached engine and the plan that reuses it) and return its gate report; None (and no engine_dir)
    when the entry cannot be read, or is of another format, so the caller builds the engine instead."""
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    try:
        shutil.copytree(hit, engine_dir, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(COMPLETE))
        config_path = engine_dir / ENGINE_FILE
        config = EngineConfig.from_dict(json.loads(config_path.read_text()))
        config_path.unlink()  # a hard link: write a new file, never through the link into the cache
        write_contract(config_path, config.with_batching(plan.batching))
        return read_gate_report(json.loads((engine_dir / REPORT_FILE).read_text()))
    except (OSError, ValueError, ContractError):
        shutil.rmtree(engine_dir, ignore_errors=True)
        return None
