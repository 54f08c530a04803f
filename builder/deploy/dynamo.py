"""A DynamoGraphDeployment (NVIDIA Dynamo's operator, nvidia.com/v1alpha1) for one build: Dynamo's frontend (the
OpenAI routes, tokenization, KV-aware routing) and the build's engine as workers, both run from the build's image,
which must carry Dynamo (`mbuild package --with dynamo`).

Discovery is the operator's Kubernetes backend, requests go over TCP and KV events over ZMQ: no etcd, no NATS. The
operator names one Dynamo namespace per graph (DYN_NAMESPACE, which Kubernetes expands in the arguments); workers
register there and the frontend looks only there, so two graphs in one Kubernetes namespace never share workers.
The fields are those of the operator's CRD (tests validate against it); probes and the status port follow the
operator's own defaults for each component type.
"""

from __future__ import annotations

import math
from typing import Any

from builder.deploy import k8s
from builder.deploy.spec import PORT, UID, DeploySpec
from builder.errors import InputError
from runtimes.dynamo import FRONTEND_MODULE, PLANES, WORKER_MODULE

API_VERSION = "nvidia.com/v1alpha1"
FRONTEND, WORKER, PREFILL = "Frontend", "MbuildWorker", "MbuildPrefill"  # the graph's service names
SYSTEM_PORT = 9090  # the operator's status port for workers ("system"): /live, /health
KV_PORT = 9091  # a prefill worker's KV for decode workers (runtimes/dynamo/kv_transfer.py), fixed for network policies
FRONTEND_MEMORY = "2Gi"  # its tokenizer and router: 113 MB resident with the test Llama; room for a large vocabulary
NAMESPACE = ["--namespace", "$(DYN_NAMESPACE)"]


def _security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _pod(spec: DeploySpec, args: list[str], extra: dict[str, Any], placed: tuple[str, ...] = ()) -> dict[str, Any]:
    """extraPodSpec: the image, its command, a writable /tmp (the model card, the worker's scratch) under a
    read-only root; placed: the pod's keys that put it on a GPU node, as the k8s format's."""
    pod = k8s.pod_spec(spec, "unused")
    main = {"image": spec.image, "imagePullPolicy": "IfNotPresent", "command": ["python3"], "args": args,
            "securityContext": _security(), "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}], **extra}
    kept: dict[str, Any] = {key: pod[key] for key in ("securityContext", "volumes", *placed) if key in pod}
    return {**kept, "mainContainer": main}


def _get(path: str, port: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": timeout,
            "failureThreshold": failures}


def frontend(spec: DeploySpec, router: str, api_key_secret: str) -> dict[str, Any]:
    """With the Secret's key set, the frontend's process gates every route but /live and /health on it
    (runtimes/dynamo/gate.py): Dynamo's own HTTP service checks no key."""
    args = ["-m", FRONTEND_MODULE, "--http-port", str(PORT), "--router-mode", router, *NAMESPACE,
            "--discovery-backend", "kubernetes", *PLANES]
    return {
        "componentType": "frontend", "replicas": 1, "labels": spec.labels, "envs": [k8s.api_key_env(api_key_secret)],
        "resources": {"requests": {"cpu": "1", "memory": FRONTEND_MEMORY}, "limits": {"memory": FRONTEND_MEMORY}},
        "livenessProbe": _get("/live", "http", 10, 3, 3), "readinessProbe": _get("/health", "http", 10, 3, 3),
        "extraPodSpec": _pod(spec, args, {"ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]}),
    }


def worker(spec: DeploySpec, replicas: int, role: str = "agg") -> dict[str, Any]:
    """role: agg (prefill and decode), or prefill or decode apart, the prompt's KV moved from one to the other."""
    handoff = ["--kv-host", "$(POD_IP)", "--kv-port", str(KV_PORT)] if role == "prefill" else []
    args = ["-m", WORKER_MODULE, *NAMESPACE, "--discovery-backend", "kubernetes", *PLANES,
            *(["--disaggregation-mode", role] if role != "agg" else []), *handoff]
    ports = [{"name": "system", "containerPort": SYSTEM_PORT, "protocol": "TCP"},
             *([{"name": "kv", "containerPort": KV_PORT, "protocol": "TCP"}] if handoff else [])]
    pod_ip = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}] if handoff else []
    resources = k8s.resources(spec)
    memory = resources["limits"]["memory"]
    gpus = {"gpu": str(spec.gpus)} if spec.gpus else {}  # the CRD's resources are strings
    startup = _get("/live", "system", 10, 5, math.ceil(spec.startup_seconds / 10))
    return {
        "componentType": "worker" if role == "agg" else role, "replicas": replicas, "labels": spec.labels,
        "envs": [{"name": "DYN_SYSTEM_PORT", "value": str(SYSTEM_PORT)}, *pod_ip],
        "resources": {"requests": {"cpu": "1", "memory": memory, **gpus}, "limits": {"memory": memory, **gpus}},
        "livenessProbe": _get("/live", "system", 5, 4, 3), "readinessProbe": _get("/health", "system", 10, 4, 3),
        "extraPodSpec": _pod(spec, args, {
            "ports": ports,
            # loading the engine may take minutes: liveness waits until the worker is up
            "startupProbe": startup}, placed=("nodeSelector", "tolerations")),
    }


def graph_deployment(spec: DeploySpec, replicas: int, router: str, api_key_secret: str,
                     prefill: int = 0) -> dict[str, Any]:
    """replicas workers; with prefill > 0, that many prefill workers beside replicas decode workers."""
    if spec.task != "text-generation":
        raise InputError(f"--format dynamo serves language models; {spec.model} is a {spec.task} model",
                         hint="use --format k8s, helm or kserve for it")
    if "dynamo" not in spec.extras:
        raise InputError(f"{spec.image} does not carry NVIDIA Dynamo, which its frontend and workers run",
                         hint=f"package it again with --with dynamo: mbuild package {spec.model} --with dynamo")
    return {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment", "metadata": k8s.metadata(spec),
            "spec": {"services": {FRONTEND: frontend(spec, router, api_key_secret),
                                  **({PREFILL: worker(spec, prefill, "prefill")} if prefill else {}),
                                  WORKER: worker(spec, replicas, "decode" if prefill else "agg")}}}
