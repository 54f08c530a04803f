"""The image, built by the real Docker engine from a local base, runs healthy and serves MiniLM."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonhttp
import yaml
from openai import OpenAI

from tests.integration.conftest import DOCKER_TAG as TAG
from tests.integration.conftest import TEXTS, cosines, package_docker_image
from tests.support.containers import docker, inspect, running, wait_healthy
from tests.support.deploy_cases import validate_core
from tests.support.net import wait_for_status
from tests.support.procs import mbuild

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def test_image_metadata(minilm_image: str) -> None:
    config = inspect(minilm_image)["Config"]
    labels = config["Labels"]
    for key in ("title", "version", "created", "source"):
        assert labels[f"org.opencontainers.image.{key}"]
    assert labels["org.opencontainers.image.version"] == "it"
    assert labels["dev.mbuild.model.id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(labels["dev.mbuild.model.revision"]) == 40
    assert labels["dev.mbuild.profile"] == "onnxruntime-cpu-fp32-tp1-latency"
    assert (labels["dev.mbuild.engine"], labels["dev.mbuild.precision"]) == ("onnxruntime", "fp32")
    assert config["User"] == "10001:10001"
    assert "8000/tcp" in config["ExposedPorts"]
    assert "runtimes.healthcheck" in " ".join(config["Healthcheck"]["Test"])


def test_image_has_no_torch_or_transformers(minilm_image: str) -> None:
    probe = docker("run", "--rm", "--network", "host", "--entrypoint", "python3", minilm_image,
                   "-c", "import importlib.util as u; print([m for m in ('torch', 'transformers', 'builder') "
                         "if u.find_spec(m)])")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def test_container_becomes_healthy_and_serves(minilm_image: str, reference_embeddings: np.ndarray) -> None:
    with running(minilm_image) as (container, url):
        wait_healthy(container)
        body = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "truncate": "END"}, timeout=30).json()
        got = np.array([d["embedding"] for d in body["data"]])
        assert cosines(got, reference_embeddings).min() >= 0.9999

        with OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
            result = client.embeddings.create(model=MODEL, input=TEXTS[0])
        assert cosines(np.array([result.data[0].embedding]), reference_embeddings[:1]).min() >= 0.9999

        triton = tritonhttp.InferenceServerClient(url=url.removeprefix("http://"))
        assert triton.is_server_ready() and triton.is_model_ready(MODEL)
        text = tritonhttp.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=True)
        answer = triton.infer(MODEL, [text], parameters={"truncate": "END"},
                              outputs=[tritonhttp.InferRequestedOutput("embedding", binary_data=True)])
        assert cosines(answer.as_numpy("embedding"), reference_embeddings).min() >= 0.9999
        triton.close()

        stop = docker("stop", "--time", "20", container)
        assert stop.returncode == 0
        state = inspect(container, "container")["State"]
        assert state["ExitCode"] == 0  # SIGTERM ends the server cleanly


def test_the_deploy_startup_probe_is_sized_from_the_measured_load(image_build: Path, minilm_image: str) -> None:
    """`mbuild deploy BUILD_DIR` sizes the startup probe from the load the build's gate timed, and the real
    container becomes ready well inside that budget."""
    load_seconds = json.loads((image_build / "report.json").read_text())["load_seconds"]
    assert 0 < load_seconds < 60
    result = mbuild("deploy", str(image_build))
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    validate_core(objects)  # the real build's manifests, strictly against Kubernetes' schemas
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    assert budget == probe["periodSeconds"] * math.ceil(max(120, 60 + math.ceil(4 * load_seconds))
                                                        / probe["periodSeconds"])
    started = time.monotonic()
    with running(minilm_image) as (_, url):
        wait_for_status(f"{url}/v1/health/ready", timeout=budget)
        ready = time.monotonic() - started  # from `docker run`, as the kubelet counts
    print(f"measured load {load_seconds:.2f} s in the gate; container ready in {ready:.1f} s; budget {budget} s")
    assert ready < budget
    # The image alone, as docker holds it: its label (through the Dockerfile's quoting) carries the plan.
    from_image = mbuild("deploy", minilm_image)
    assert from_image.returncode == 0, from_image.stderr
    pod = next(o for o in yaml.safe_load_all(from_image.stdout) if o["kind"] == "Deployment")["spec"]["template"]
    assert pod["spec"]["containers"][0]["resources"] == deployment["spec"]["template"]["spec"]["containers"][0][
        "resources"]


def test_an_unchanged_rebuild_reuses_build_and_image(image_build: Path, minilm_hf_home: Path) -> None:
    before = inspect(TAG)["Id"]
    output = package_docker_image(minilm_hf_home, image_build)
    assert "reused" in output and "already built by docker" in output
    assert "✓ export" not in output and "✓ image" not in output
    assert inspect(TAG)["Id"] == before
