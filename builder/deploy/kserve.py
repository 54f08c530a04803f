"""A KServe InferenceService for one build: a custom predictor running the image, in RawDeployment mode (a
Deployment and an HPA, no Knative: scale-to-zero would unload a model that takes minutes to load)."""

from __future__ import annotations

from typing import Any

from builder.deploy import k8s
from builder.deploy.spec import PORT, DeploySpec
from runtimes.bundle.engine import ENCODER_TASKS

# KServe's name for the predictor's main container: its controller finds the serving port there.
CONTAINER = "kserve-container"


def _container(spec: DeploySpec, api_key_secret: str) -> dict[str, Any]:
    container = k8s.container(spec, api_key_secret)
    container["name"] = CONTAINER
    # http1: the port name KServe and Knative read as plain HTTP/1.1 (h2c would be gRPC).
    container["ports"] = [{"name": "http1", "containerPort": PORT, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[probe] = {**container[probe], "httpGet": {**container[probe]["httpGet"], "port": PORT}}
    if spec.task in ENCODER_TASKS:
        # KServe reads a custom predictor's protocol from this variable (its webhook accepts v1 or v2): an
        # encoder's image serves the Open Inference Protocol, v2. A language model's OpenAI routes are neither.
        container["env"] = [*container["env"], {"name": "PROTOCOL", "value": "v2"}]
    return container


def inference_service(spec: DeploySpec, minimum: int, maximum: int, api_key_secret: str) -> dict[str, Any]:
    pod = k8s.pod_spec(spec, api_key_secret)
    pod["containers"] = [_container(spec, api_key_secret)]
    meta = k8s.metadata(spec)
    meta["annotations"] = {
        "serving.kserve.io/deploymentMode": "RawDeployment",
        "serving.kserve.io/autoscalerClass": "hpa",
        # Every route family the image serves, for people and tools (PROTOCOL above names KServe's one).
        "dev.mbuild/protocols": "v2,openai" if spec.task in ENCODER_TASKS else "openai",
    }
    return {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": meta,
        "spec": {"predictor": {
            "minReplicas": minimum, "maxReplicas": maximum,
            "scaleMetric": "cpu", "scaleTarget": k8s.CPU_TARGET,
            "labels": spec.labels, "annotations": k8s.pod_annotations(),
            "deploymentStrategy": k8s.ROLLOUT,
            **pod,
        }},
    }
