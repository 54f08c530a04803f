"""A Helm chart for one build: templates/helm/ (static Go templates) with a Chart.yaml and a values.yaml written
from the build. The values carry the same pieces the k8s manifests are made of (resources, probes, security
contexts, the autoscaling metric), so the chart at its defaults renders the k8s format's objects (by test)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from builder.deploy import k8s
from builder.deploy.spec import DRAIN_SECONDS, GRACE_SECONDS, METRICS, PORT, DeploySpec, split_image
from builder.errors import InputError
from builder.resources import resource_dir

GENERATED = "dev.mbuild/generated"  # Chart.yaml annotation: a folder mbuild may write over


def _image(spec: DeploySpec) -> dict[str, str]:
    repository, tag, digest = split_image(spec.image)
    if not tag and not digest:
        raise InputError(f"the image {spec.image!r} has neither a digest nor a tag",
                         hint="give --image REPO@sha256:... or REPO:TAG")
    return {"repository": repository, "digest": digest, "tag": tag, "pullPolicy": "IfNotPresent"}


def values(spec: DeploySpec, replicas: int, minimum: int, maximum: int, api_key_secret: str) -> dict[str, Any]:
    """values.yaml: every key the templates read is here (they render with missingkey=error)."""
    pod = k8s.pod_spec(spec, api_key_secret)
    (container,) = pod["containers"]
    metric, target = k8s.load_metric(spec)
    host_labels = {k: v for k, v in spec.labels.items()
                   if k not in ("app.kubernetes.io/name", "app.kubernetes.io/managed-by")}
    return {
        "fullnameOverride": "",
        "image": _image(spec),
        "imagePullSecrets": [],
        "replicaCount": replicas,
        "labels": host_labels,
        "containerPort": PORT,
        "drainSeconds": DRAIN_SECONDS,
        "graceSeconds": GRACE_SECONDS,
        "resources": container["resources"],
        "probes": {key: container[key] for key in ("startupProbe", "readinessProbe", "livenessProbe")},
        "podAnnotations": k8s.pod_annotations(),
        "podSecurityContext": pod["securityContext"],
        "securityContext": container["securityContext"],
        "nodeSelector": pod.get("nodeSelector", {}),
        "tolerations": pod.get("tolerations", []),
        "affinity": {},
        "service": {"type": "ClusterIP", "port": PORT},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
        "autoscaling": {"enabled": True, "minReplicas": minimum, "maxReplicas": maximum,
                        "targetCPUUtilizationPercentage": k8s.CPU_TARGET,
                        "podsMetric": {"name": metric, "averageValue": target},
                        "scaleDownStabilizationSeconds": 300},
        # existingSecret "" means NAME-api-key; apiKey makes that Secret (it is then stored in Helm's release).
        "auth": {"existingSecret": "" if api_key_secret == f"{spec.name}-api-key" else api_key_secret,
                 "apiKey": "", "secretKey": k8s.API_KEY_SECRET_KEY},
        "ingress": {"enabled": False, "className": "", "annotations": {},
                    "hosts": [{"host": f"{spec.name}.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
                    "tls": []},
        "serviceMonitor": {"enabled": True, "path": METRICS, "interval": "15s"},
    }


def chart(spec: DeploySpec) -> dict[str, Any]:
    return {"apiVersion": "v2", "name": spec.name, "type": "application", "version": "0.1.0",
            "appVersion": spec.version,
            "description": f"{spec.model} served by mbuild ({spec.task}, profile {spec.profile})",
            "annotations": {GENERATED: "true", "dev.mbuild/profile-id": spec.profile_id}}


def _check_target(folder: Path) -> None:
    """Write only into a new or empty folder, or over a chart mbuild wrote: never over someone's files."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise InputError(f"{folder} exists and is not a folder", hint="give --output a new folder for the chart")
    if not any(folder.iterdir()):
        return
    try:
        ours = yaml.safe_load((folder / "Chart.yaml").read_text())["annotations"][GENERATED] == "true"
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        ours = False
    if not ours:
        raise InputError(f"{folder} is not empty and holds no chart mbuild wrote",
                         hint="give --output a new folder, or remove this one")


def write_chart(spec: DeploySpec, folder: Path, replicas: int, minimum: int, maximum: int,
                api_key_secret: str) -> list[str]:
    """The chart in folder; returns the files written, relative to it."""
    _check_target(folder)
    shutil.rmtree(folder / "templates", ignore_errors=True)
    shutil.copytree(resource_dir("templates") / "helm" / "templates", folder / "templates")
    dump = {"sort_keys": False, "default_flow_style": False}
    (folder / "Chart.yaml").write_text(yaml.safe_dump(chart(spec), **dump))
    (folder / "values.yaml").write_text(
        "# Values for mbuild's chart, written from the build's profile. Override any of them with -f or --set.\n"
        + yaml.safe_dump(values(spec, replicas, minimum, maximum, api_key_secret), **dump))
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
