"""`mbuild deploy --format kserve`: the InferenceService validates with zero errors against KServe's schema (a
fixture written from the KServe SDK's models by tests/support/kserve_schema.py, its pod parts checked against
Kubernetes' own strict schemas), kubectl reads it, golden files pin it, and its container, probes, resources,
GPUs and replicas are the k8s format's."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support.deploy_cases import (
    CASES,
    Deployed,
    assert_each_refused,
    assert_valid,
    crd_validator,
    deployed_beside_k8s,
    image_for,
    kubectl_reads,
    plan_file,
)
from tests.support.golden import assert_golden
from tests.support.kserve_schema import FIXTURE


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return crd_validator(FIXTURE)


@pytest.fixture(scope="module", params=list(CASES))
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Deployed:
    folder = tmp_path_factory.mktemp("kserve")
    plan = plan_file(request.param, folder)
    args = ("--image", image_for(request.param), "--namespace", "models", "--min-replicas", "2",
            "--max-replicas", "6")
    return request.param, *deployed_beside_k8s(plan, "kserve", *args)


def test_the_inference_service_validates_against_the_kserve_schema(
        validator: jsonschema.Draft202012Validator, deployed: Deployed) -> None:
    assert_valid(validator, deployed[2], "serving.kserve.io/v1beta1", "InferenceService")


def test_the_schema_refuses_what_kserve_would(
        validator: jsonschema.Draft202012Validator, deployed: Deployed) -> None:
    """The check can fail: each of these is refused, down into the pod's Kubernetes types."""
    _, _, isvc, _ = deployed
    breakages = {
        "an unknown predictor field": lambda o: o["spec"]["predictor"].update(replicas=2),
        "replicas as text": lambda o: o["spec"]["predictor"].update(minReplicas="2"),
        "no predictor": lambda o: o["spec"].pop("predictor"),
        "a container without a name": lambda o: o["spec"]["predictor"]["containers"][0].pop("name"),
        "a probe with a typo": lambda o: o["spec"]["predictor"]["containers"][0]["readinessProbe"].update(
            periodSecond=5),
        "a status": lambda o: o.update(status={}),
    }
    assert_each_refused(validator, isvc, breakages)


def test_kubectl_reads_it(deployed: Deployed, tmp_path: Path) -> None:
    _, text, _, _ = deployed
    assert kubectl_reads(text, tmp_path) == ["inferenceservice.serving.kserve.io/" + yaml.safe_load(text)["metadata"]
                                             ["name"]]


def test_the_golden_inference_service(deployed: Deployed) -> None:
    case, text, _, _ = deployed
    assert_golden(f"deploy/{case}.kserve.yaml", text)


def test_it_runs_the_k8s_formats_pod(deployed: Deployed) -> None:
    """The same image, resources, GPUs, probes (by port number: KServe's port is named http1), security and
    drain as the Deployment; replicas as asked."""
    _, _, isvc, deployment = deployed
    predictor = isvc["spec"]["predictor"]
    pod = deployment["spec"]["template"]["spec"]
    (ours,), (theirs,) = predictor["containers"], pod["containers"]
    assert ours["name"] == "kserve-container"
    assert ours["ports"][0]["containerPort"] == theirs["ports"][0]["containerPort"]
    for key in ("image", "resources", "securityContext", "volumeMounts"):
        assert ours[key] == theirs[key], key
    # KServe's protocol variable: v2 (the Open Inference Protocol) where the image serves it, embeddings
    protocol = [e for e in ours["env"] if e["name"] == "PROTOCOL"]
    assert [e for e in ours["env"] if e["name"] != "PROTOCOL"] == theirs["env"]
    embedding = isvc["metadata"]["labels"]["app.kubernetes.io/component"] == "embedding"
    assert protocol == ([{"name": "PROTOCOL", "value": "v2"}] if embedding else [])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ours[probe]["httpGet"]["path"] == theirs[probe]["httpGet"]["path"]
        assert ours[probe]["httpGet"]["port"] == ours["ports"][0]["containerPort"]
    for key in ("terminationGracePeriodSeconds", "securityContext", "volumes", "nodeSelector", "tolerations"):
        assert predictor.get(key) == pod.get(key), key
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 6)
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
