"""`mbuild deploy --format helm`: the chart renders (with Go's text/template and sprig, what Helm is made of; no
helm binary installs here), at its defaults into the very objects of `--format k8s`, and with non-default values
(ingress, an API key Secret, no autoscaler, a tag, other resources) into objects that validate strictly and
that kubectl reads. Golden files pin the rendered defaults."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy_cases import CASES, cli, image_for, kubectl_reads, missing_tool, plan_file, validate_core
from tests.support.golden import assert_golden

RENDERER = Path(__file__).resolve().parents[3] / "support" / "helm_render.go"
GOPATH = Path("/usr/share/gocode")  # Debian's Go libraries (golang-github-masterminds-sprig-dev, ...-ghodss-yaml-dev)
HELM_LABELS = ("app.kubernetes.io/instance", "helm.sh/chart")


@pytest.fixture(scope="module")
def helm_render(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [what for what, there in (("go", shutil.which("go")),
                                        ("sprig", (GOPATH / "src/github.com/Masterminds/sprig").is_dir()),
                                        ("ghodss/yaml", (GOPATH / "src/github.com/ghodss/yaml").is_dir())) if not there]
    if missing:
        missing_tool(f"the chart renderer needs {', '.join(missing)} (tests/run.sh installs them as root)")
    folder = tmp_path_factory.mktemp("helm-render")
    env = {**os.environ, "GOPATH": str(GOPATH), "GO111MODULE": "off", "GOCACHE": str(folder / "cache"),
           "GOFLAGS": ""}
    built = subprocess.run(["go", "build", "-o", str(folder / "helm_render"), str(RENDERER)], env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    return folder / "helm_render"


def render(renderer: Path, chart: Path, release: str, *values: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(renderer), str(chart), release, "models", *map(str, values)], capture_output=True,
                          text=True, timeout=60, check=False)


def chart_for(case: str, folder: Path) -> tuple[Path, str]:
    plan = plan_file(case, folder)
    result = cli("deploy", str(plan), "--format", "helm", "--image", image_for(case), "--min-replicas", "2",
                 "--max-replicas", "6", "--output", str(folder / "chart"))
    assert result.returncode == 0, result.stderr
    assert "helm install" in result.stderr
    k8s = cli("deploy", str(plan), "--format", "k8s", "--image", image_for(case), "--namespace", "models",
              "--min-replicas", "2", "--max-replicas", "6")
    assert k8s.returncode == 0, k8s.stderr
    return folder / "chart", k8s.stdout


def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """Helm's own labels off, and managed-by as mbuild writes it: the rest must be identical."""
    def clean(labels: dict[str, str]) -> dict[str, str]:
        kept = {k: v for k, v in labels.items() if k not in HELM_LABELS}
        assert kept.get("app.kubernetes.io/managed-by") == "Helm"
        return {**kept, "app.kubernetes.io/managed-by": "mbuild"}

    obj["metadata"]["labels"] = clean(obj["metadata"]["labels"])
    if obj["kind"] == "Deployment":
        template = obj["spec"]["template"]["metadata"]
        template["labels"] = clean(template["labels"])
    return obj


@pytest.mark.parametrize("case", list(CASES))
def test_the_chart_at_its_defaults_renders_the_k8s_objects(helm_render: Path, case: str, tmp_path: Path) -> None:
    chart, k8s_text = chart_for(case, tmp_path)
    name = yaml.safe_load((chart / "Chart.yaml").read_text())["name"]
    rendered = render(helm_render, chart, name)
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    by_kind = {o["kind"]: without_helm_labels(o) for o in objects}
    expected = {o["kind"]: o for o in yaml.safe_load_all(k8s_text)}
    assert by_kind == expected
    assert_golden(f"deploy/{case}.helm.yaml", rendered.stdout)


def test_non_default_values_render_valid_objects(helm_render: Path, tmp_path: Path) -> None:
    chart, _ = chart_for("llama-8b-h100x2", tmp_path)
    overrides = {
        "replicaCount": 3,
        "image": {"digest": "", "tag": "v2"},
        "autoscaling": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "serviceMonitor": {"enabled": False},
        "auth": {"apiKey": "s3cret"},
        "resources": {"limits": {"memory": "200Gi"}, "requests": {"memory": "200Gi"}},
        "tolerations": [],  # lists replace
        "ingress": {"enabled": True, "className": "nginx",
                    "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "600"},
                    "hosts": [{"host": "llm.example.com", "paths": [{"path": "/v1", "pathType": "Prefix"}]}],
                    "tls": [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]},
    }
    values = tmp_path / "mine.yaml"
    values.write_text(yaml.safe_dump(overrides))
    rendered = render(helm_render, chart, "llm", values)
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    kinds = {o["kind"]: o for o in objects}
    assert sorted(kinds) == ["Deployment", "Ingress", "Secret", "Service"]
    validate_core(objects)
    assert len(kubectl_reads(rendered.stdout, tmp_path)) == len(objects)

    deployment = kinds["Deployment"]
    assert deployment["metadata"]["name"] == "llm" and deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/models/llama-3.1-8b:v2"
    gpus = json.loads((tmp_path / "plan.json").read_text())["requires"]["gpus"]
    assert container["resources"]["limits"] == {"memory": "200Gi", "nvidia.com/gpu": gpus}  # maps merge by key
    assert "tolerations" not in pod and pod["nodeSelector"]["nvidia.com/gpu.compute.major"] == "9"
    key_ref = next(e for e in container["env"] if e["name"] == "MBUILD_API_KEY")["valueFrom"]["secretKeyRef"]
    secret = kinds["Secret"]
    assert key_ref == {"name": secret["metadata"]["name"], "key": "api-key", "optional": False}
    assert base64.b64decode(secret["data"]["api-key"]) == b"s3cret"
    rule = kinds["Ingress"]["spec"]["rules"][0]
    assert rule["host"] == "llm.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "llm", "port": {"name": "http"}}
    assert kinds["Service"]["spec"]["ports"][0]["name"] == "http"


def test_the_renderer_refuses_what_helm_would(helm_render: Path, tmp_path: Path) -> None:
    """The check can fail: an image with neither digest nor tag, and a key the values lack, stop the render."""
    chart, _ = chart_for("minilm-cpu", tmp_path)
    no_image = tmp_path / "no-image.yaml"
    no_image.write_text(yaml.safe_dump({"image": {"digest": "", "tag": ""}}))
    result = render(helm_render, chart, "x", no_image)
    assert result.returncode != 0 and "image.tag or image.digest is required" in result.stderr
    no_key = tmp_path / "no-key.yaml"
    no_key.write_text(yaml.safe_dump({"service": None}))
    result = render(helm_render, chart, "x", no_key)
    assert result.returncode != 0 and "service" in result.stderr


def test_the_chart_folder_is_never_written_over_someone_elses(tmp_path: Path) -> None:
    plan = plan_file("minilm-cpu", tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = cli("deploy", str(plan), "--format", "helm", "--output", str(mine))
    assert result.returncode == 2 and "holds no chart mbuild wrote" in result.stderr
    assert "Traceback" not in result.stderr and (mine / "notes.txt").read_text() == "keep me"
    ours = tmp_path / "ours"
    for _ in range(2):  # a chart mbuild wrote is written over
        result = cli("deploy", str(plan), "--format", "helm", "--output", str(ours))
        assert result.returncode == 0, result.stderr
    assert (ours / "templates" / "deployment.yaml").exists()
