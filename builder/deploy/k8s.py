"""Kubernetes objects for one build: Deployment, Service, PodDisruptionBudget, HorizontalPodAutoscaler and a
ServiceMonitor, as plain dicts (the Helm chart and KServe write theirs from the same pieces)."""

from __future__ import annotations

import math
from typing import Any

from builder.deploy.spec import DRAIN_SECONDS, GRACE_SECONDS, LIVE, METRICS, PORT, READY, UID, DeploySpec

PERIOD = 5  # seconds between startup and readiness probes
CPU_TARGET = 70  # % of the CPU request, the HPA's CPU target
API_KEY_SECRET_KEY = "api-key"
# A new version takes traffic only once ready: one extra pod at a time, none taken away first.
ROLLOUT = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def metadata(spec: DeploySpec, name: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name or spec.name, "labels": spec.labels}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    return meta


def resources(spec: DeploySpec) -> dict[str, Any]:
    """Memory from the profile's measured need (request = limit: the pod is never OOM-killed for growing into
    what was planned); one CPU per CPU replica; GPUs as the device plugin counts them."""
    memory = f"{spec.memory_gib}Gi"
    requests: dict[str, Any] = {"memory": memory, "cpu": "1"}
    limits: dict[str, Any] = {"memory": memory}
    if spec.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = spec.gpus
    return {"requests": requests, "limits": limits}


def probes(spec: DeploySpec) -> dict[str, Any]:
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    return {
        # Startup: loading the engine may take minutes; liveness waits until it is done.
        "startupProbe": {**get(READY), "periodSeconds": PERIOD,
                         "failureThreshold": math.ceil(spec.startup_seconds / PERIOD), "timeoutSeconds": 3},
        "readinessProbe": {**get(READY), "periodSeconds": PERIOD, "failureThreshold": 2, "timeoutSeconds": 3},
        "livenessProbe": {**get(LIVE), "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 3},
    }


def api_key_env(api_key_secret: str) -> dict[str, Any]:
    """MBUILD_API_KEY from the Secret; optional, so a missing Secret starts an open endpoint that logs it is open."""
    return {"name": "MBUILD_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": api_key_secret, "key": API_KEY_SECRET_KEY, "optional": True}}}


def container(spec: DeploySpec, api_key_secret: str) -> dict[str, Any]:
    return {
        "name": "model", "image": spec.image, "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "MBUILD_DRAIN_SECONDS", "value": str(DRAIN_SECONDS)},
                {"name": "MBUILD_GRACE_SECONDS", "value": str(GRACE_SECONDS)},
                api_key_env(api_key_secret)],
        "resources": resources(spec),
        **probes(spec),
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def pod_spec(spec: DeploySpec, api_key_secret: str) -> dict[str, Any]:
    pod: dict[str, Any] = {
        # The runtime's drain, then its grace period; it ends in-flight requests 2 s before its own SIGKILL.
        "terminationGracePeriodSeconds": DRAIN_SECONDS + GRACE_SECONDS,
        "securityContext": {"runAsNonRoot": True, "fsGroup": UID},
        "containers": [container(spec, api_key_secret)],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if spec.gpus:
        # NVIDIA GPU feature discovery's labels: the compute capability the engine was built for.
        major, _, minor = (spec.compute_capabilities or ("",))[0].partition(".")
        if major:
            pod["nodeSelector"] = {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor or "0"}
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def pod_annotations() -> dict[str, str]:
    """The scrape annotations Prometheus' kubernetes-pods job reads (where no ServiceMonitor is used)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/path": METRICS, "prometheus.io/port": str(PORT)}


def deployment(spec: DeploySpec, replicas: int, api_key_secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(spec),
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": spec.selector},
            "strategy": ROLLOUT,
            "template": {"metadata": {"labels": spec.labels, "annotations": pod_annotations()},
                         "spec": pod_spec(spec, api_key_secret)},
        },
    }


def service(spec: DeploySpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(spec),
            "spec": {"type": "ClusterIP", "selector": spec.selector,
                     "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}


def disruption_budget(spec: DeploySpec) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(spec),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": spec.selector}}}


def load_metric(spec: DeploySpec) -> tuple[str, str]:
    """The per-pod series the HPA scales on (the Prometheus adapter exposes /v1/metrics' series under their
    names), and its target: sequences decoding for a language model (3/4 of its slots), else requests queued."""
    if spec.task == "text-generation":
        return "mbuild_running_sequences", str(max(1, spec.max_batch * 3 // 4))
    return "mbuild_queue_depth", str(max(1, spec.max_batch))


def autoscaler(spec: DeploySpec, minimum: int, maximum: int) -> dict[str, Any]:
    metric, target = load_metric(spec)
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata(spec),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name},
            "minReplicas": minimum, "maxReplicas": maximum,
            "metrics": [
                {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                           "averageUtilization": CPU_TARGET}}},
                {"type": "Pods", "pods": {"metric": {"name": metric},
                                          "target": {"type": "AverageValue", "averageValue": target}}},
            ],
            # Loading a model takes minutes: scale down slowly, so a dip does not throw away warm replicas.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def service_monitor(spec: DeploySpec) -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": metadata(spec),
            "spec": {"selector": {"matchLabels": spec.selector},
                     "endpoints": [{"port": "http", "path": METRICS, "interval": "15s"}]}}


def manifests(spec: DeploySpec, replicas: int, minimum: int, maximum: int, api_key_secret: str
              ) -> list[dict[str, Any]]:
    return [deployment(spec, replicas, api_key_secret), service(spec), disruption_budget(spec),
            autoscaler(spec, minimum, maximum), service_monitor(spec)]
