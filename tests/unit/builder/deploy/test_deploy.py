"""`mbuild deploy --format k8s` for the MiniLM CPU plan and a GPU plan (llama-3.1-8b on h100x2): every object
validates strictly against Kubernetes' own schemas (kubernetes-validate), the ServiceMonitor against the
Prometheus operator's (npm), kubectl's decoder reads them, golden files pin them, and what they say matches the
profile and the runtime's routes and metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtimes.api import probes
from runtimes.bundle.codec import write_contract
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from tests.support.bundles import encoder_report
from tests.support.deploy_cases import CASES, cli, image_for, kubectl_reads, missing_tool, plan_file, validate_core
from tests.support.golden import assert_golden

PROMETHEUS_OPERATOR_MODELS = "6.0.0"  # npm: validators compiled from the Prometheus operator's CRDs
SERVICEMONITOR_CHECK = Path(__file__).resolve().parents[3] / "support" / "servicemonitor_check.mjs"


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


@pytest.fixture(scope="module")
def prometheus_operator_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """@kubernetes-models/prometheus-operator from npm, beside the check script."""
    if not (shutil.which("node") and shutil.which("npm")):
        missing_tool("the ServiceMonitor check needs node and npm (tests/run.sh installs them as root)")
    folder = tmp_path_factory.mktemp("prometheus-operator")
    installed = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(folder),
                                f"@kubernetes-models/prometheus-operator@{PROMETHEUS_OPERATOR_MODELS}"],
                               capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr
    shutil.copy(SERVICEMONITOR_CHECK, folder / SERVICEMONITOR_CHECK.name)
    return folder / SERVICEMONITOR_CHECK.name


def check_service_monitor(script: Path, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (script.parent / "monitor.json").write_text(json.dumps(obj))
    return subprocess.run(["node", str(script), str(script.parent / "monitor.json")], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_service_monitor_validates_against_the_prometheus_operator_schema(
        deployed: tuple[str, dict[str, Any], str, list[dict[str, Any]]], prometheus_operator_models: Path) -> None:
    _, _, _, objects = deployed
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    result = check_service_monitor(prometheus_operator_models, monitor)
    assert result.returncode == 0 and result.stdout.strip() == "valid", result.stdout + result.stderr
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"port": "http", "interval": "15 seconds"}]}}
    result = check_service_monitor(prometheus_operator_models, broken)  # the check can fail
    assert result.returncode == 1 and "interval" in result.stdout


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


def test_the_startup_probe_follows_the_build_s_measured_load(tmp_path: Path) -> None:
    """A build directory's report.json gives the load time; a saved plan falls back to the estimate from the
    weights; a report whose load time is no number is refused, naming the field."""
    build = tmp_path / "build"
    build.mkdir()
    plan_file("llama-8b-h100x2", build)

    def budget(load_seconds: float | None) -> int:
        if load_seconds is not None:
            write_contract(build / "report.json", encoder_report(True, load_seconds=load_seconds))
        result = cli("deploy", str(build), "--image", image_for("llama-8b-h100x2"))
        assert result.returncode == 0, result.stderr
        deployment = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "Deployment")
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        return int(probe["periodSeconds"] * probe["failureThreshold"])

    assert budget(None) != 260
    assert budget(50.0) == 260  # 60 + 4 x 50
    assert budget(1.5) == 120  # never under the image's own
    (build / "report.json").write_text(json.dumps({**encoder_report(True).to_dict(), "load_seconds": "soon"}))
    refused = cli("deploy", str(build), "--image", image_for("llama-8b-h100x2"))
    assert refused.returncode == 2 and "report.json: load_seconds must be a finite number" in refused.stderr


def test_bad_sources_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "layout").mkdir()
    (tmp_path / "layout" / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (tmp_path / "layout" / "index.json").write_text('{"schemaVersion": 2, "manifests": []}')
    for source, words in ((str(tmp_path / "plan.json"), "not a build directory"),
                          (str(tmp_path / "none"), "does not exist"),
                          (str(tmp_path), "not a build directory"),
                          ("nosuch/image:1", "neither a build directory nor an image"),
                          (f"oci:{tmp_path / 'layout'}:x", "oci:"),
                          ("Not An Image!", "not a valid image reference")):
        result = cli("deploy", source)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
    result = cli("deploy", str(tmp_path / "plan.json"), "--min-replicas", "5", "--max-replicas", "2")
    assert result.returncode == 2 and "--min-replicas" in result.stderr


@pytest.mark.parametrize("fmt", ["k8s", "kserve"])
def test_an_output_that_is_a_folder_or_cannot_be_written_is_a_users_error(tmp_path: Path, fmt: str) -> None:
    plan = plan_file("minilm-cpu", tmp_path)
    folder = tmp_path / "manifests"
    folder.mkdir()
    result = cli("deploy", str(plan), "--format", fmt, "--image", image_for("minilm-cpu"), "-o", str(folder))
    assert result.returncode == 2 and "is a folder" in result.stderr and "hint: give the file" in result.stderr, \
        result.stderr
    assert list(folder.iterdir()) == []
    below_a_file = plan / "k8s.yaml"
    result = cli("deploy", str(plan), "--format", fmt, "--image", image_for("minilm-cpu"), "-o", str(below_a_file))
    assert result.returncode == 12 and f"cannot write {below_a_file}" in result.stderr, result.stderr
