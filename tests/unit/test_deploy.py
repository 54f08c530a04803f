"""`mbuild deploy --format k8s` for the MiniLM CPU plan and a GPU plan (llama-3.1-8b on h100x2): every object
validates strictly against Kubernetes' own schemas (kubernetes-validate), kubectl's decoder reads them, golden
files pin them, and what they say matches the profile and the runtime's routes and metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtimes.api import probes
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from tests.support.deploy_cases import CASES, cli, image_for, kubectl_reads, plan_file, validate_core
from tests.support.golden import assert_golden


@pytest.fixture(scope="module", params=list(CASES))
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, dict[str, Any], str, list[dict[str, Any]]]:
    plan = plan_file(request.param, tmp_path_factory.mktemp("plan"))
    out = plan.with_name("k8s.yaml")
    result = cli("deploy", str(plan), "--format", "k8s", "--image", image_for(request.param),
                 "--namespace", "models", "--min-replicas", "2", "--max-replicas", "6", "--output", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    return request.param, json.loads(plan.read_text()), text, list(yaml.safe_load_all(text))


def test_every_object_validates_strictly_against_the_kubernetes_schemas(
        deployed: tuple[str, dict[str, Any], str, list[dict[str, Any]]]) -> None:
    _, _, _, objects = deployed
    assert {o["kind"] for o in objects} == {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                                            "ServiceMonitor"}
    validate_core(objects)


def test_kubectl_reads_every_object(deployed: tuple[str, dict[str, Any], str, list[dict[str, Any]]],
                                    tmp_path: Path) -> None:
    _, _, text, objects = deployed
    assert len(kubectl_reads(text, tmp_path)) == len(objects)


def test_the_golden_manifests(deployed: tuple[str, dict[str, Any], str, list[dict[str, Any]]]) -> None:
    case, _, text, _ = deployed
    assert_golden(f"deploy/{case}.k8s.yaml", text)


def test_resources_probes_and_metrics_match_the_profile_and_the_runtime(
        deployed: tuple[str, dict[str, Any], str, list[dict[str, Any]]]) -> None:
    _, plan, _, objects = deployed
    kinds = {o["kind"]: o for o in objects}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    requires = plan["requires"]
    memory_gib = int(container["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert memory_gib * 1.073741824 >= requires["memory_gb"] > (memory_gib - 1) * 1.073741824
    if requires["device"] == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == requires["gpus"]
        major, minor = requires["compute_capabilities"][0].split(".")
        assert pod["nodeSelector"] == {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor}
    else:
        assert "nvidia.com/gpu" not in container["resources"]["limits"] and "nodeSelector" not in pod
    routes = {getattr(r, "path", "") for router in (probes.health, probes.metrics_router) for r in router.routes}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes
    assert container["ports"][0]["containerPort"] == Settings.from_env({}).port
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    monitor = kinds["ServiceMonitor"]["spec"]["endpoints"][0]
    assert monitor["path"] in routes
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    metric = next(m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods")
    metrics = Metrics()
    metrics.set(metric.removeprefix("mbuild_"), 1)
    assert f"{metric} 1" in metrics.render()  # the series the runtime exports under that name
    assert pod["terminationGracePeriodSeconds"] > Settings.from_env({}).grace_seconds


def test_bad_sources_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{}")
    for source, words in ((tmp_path / "plan.json", "not a build directory"), (tmp_path / "none", "not a build")):
        result = cli("deploy", str(source))
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr
    result = cli("deploy", str(tmp_path / "plan.json"), "--min-replicas", "5", "--max-replicas", "2")
    assert result.returncode == 2 and "--min-replicas" in result.stderr
