"""mbuild.lock: what exactly went into a build, file by file, for audits and rebuilds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.hashing import sha256_file
from builder.planning.plan import BuildPlan

LOCK_NAME = "mbuild.lock"


def model_files(snapshot: Path, files: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"path": name, "size": (snapshot / name).stat().st_size, "sha256": sha256_file(snapshot / name)}
            for name in files]


def write_lock(build_dir: Path, plan: BuildPlan, snapshot: Path) -> Path:
    lock = {
        "lock_version": 1,
        "plan_digest": plan.digest(),
        "image": plan.tag,
        "model": {"repo": plan.model.repo, "revision": plan.model.revision, "sha": plan.model.sha,
                  "files": model_files(snapshot, plan.model.files)},
        "profile": {"id": plan.profile.id, "name": plan.profile.name,
                    "content": plan.profile.model_dump(mode="json")},
        "base_image": plan.base_image,
        "runtime_requirements": list(plan.runtime_requirements),
        "tools": dict(plan.tools),
    }
    path = build_dir / LOCK_NAME
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return path


def read_lock(build_dir: Path) -> dict[str, Any] | None:
    path = build_dir / LOCK_NAME
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data
