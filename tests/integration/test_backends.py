"""One build context, four image backends: each image runs, becomes healthy and serves MiniLM.

The context is packaged once with the base in the local registry; then docker builds it and
`docker run`s it; podman builds it and `podman run`s it; buildah builds it and podman runs it
(shared containers-storage); the daemonless OCI writer pulls the base with its own client, and its
layout is unpacked by umoci and run by runc. Every build gets a planted HF_TOKEN in its
environment, and no image may carry it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.integration.conftest import TEXTS, Bases, cosines, tool
from tests.support.containers import docker
from tests.support.procs import mbuild
from tests.support.runners import docker_run, podman, podman_run, runc_run
from tests.support.scan import occurrences, scan_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "hf_PLANTEDsecretForTheScan0123456789"
BACKENDS = ("docker", "podman", "buildah", "oci")


TAG = "mbuild-test/backends:it"


def package(backend: str, base: str, hf_home: Path, out: Path, env: dict[str, str] | None = None) -> str:
    # The Hub offline (HF_HUB_OFFLINE), the base pulled from the test registry: --offline would keep that out too.
    result = mbuild("package", "all-minilm-l6-v2", "--backend", backend, "--base-image", base,
                    "--name", TAG.split(":")[0], "--version", "it", "--output", str(out),
                    env={"HF_HOME": str(hf_home), "HF_TOKEN": SECRET, "HF_HUB_OFFLINE": "1", **(env or {})})
    log = out / "image-build.log"
    assert result.returncode == 0, result.stderr + (log.read_text()[-3000:] if log.exists() else "")
    assert SECRET not in result.stderr + result.stdout
    return result.stderr


@dataclass(frozen=True)
class Built:
    context: Path
    records: dict[str, dict[str, str]]  # backend -> its image.json


@pytest.fixture(scope="module")
def built(bases: Bases, minilm_hf_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    for name in ("podman", "buildah"):
        tool(name, "info")
    for name in ("umoci", "runc", "skopeo"):
        tool(name, "--version")
    docker("rmi", "-f", TAG)  # a leftover from an interrupted run would be reused, not rebuilt
    podman("rmi", "-f", f"localhost/{TAG}")
    context = tmp_path_factory.mktemp("one-context")
    package("none", bases.in_registry, minilm_hf_home, context)
    records = {}
    for backend in BACKENDS:  # the same context each time: the build is reused, only the image is new
        output = package(backend, bases.in_registry, minilm_hf_home, context)
        assert "reused" in output and f"{backend} build" in output
        records[backend] = json.loads((context / "image.json").read_text())
        if backend == "podman":  # buildah shares the storage: untagged, podman's image cannot pass for buildah's
            assert podman("untag", f"localhost/{TAG}").returncode == 0
    yield Built(context, records)
    docker("rmi", "-f", TAG)
    podman("rmi", "-f", f"localhost/{TAG}")


def runner(backend: str, context: Path, work: Path) -> AbstractContextManager[str]:
    if backend == "docker":
        return docker_run(TAG)
    if backend in {"podman", "buildah"}:
        return podman_run(f"localhost/{TAG}")
    return runc_run(context / "oci", TAG, work)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_builds_an_image_that_runs_healthy_and_serves(
        backend: str, built: Built, reference_embeddings: np.ndarray, tmp_path: Path) -> None:
    assert built.records[backend]["backend"] == backend
    if backend in {"podman", "buildah"}:  # shared storage, one tag: point it at this backend's own image
        assert podman("tag", built.records[backend]["image_id"].removeprefix("sha256:"),
                      f"localhost/{TAG}").returncode == 0
    with runner(backend, built.context, tmp_path) as url:
        body = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "truncate": "END"}, timeout=60).json()
        assert cosines(np.array([d["embedding"] for d in body["data"]]), reference_embeddings).min() >= 0.9999


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_image_carries_the_planted_token(backend: str, built: Built, tmp_path: Path) -> None:
    image = built.records[backend]["image_id"]
    if backend == "oci":
        hits, probe = scan_tree(built.context / "oci", SECRET), scan_tree(built.context / "oci", "dev.mbuild.plan")
    else:
        archive = tmp_path / "image.tar"
        if backend == "docker":
            saved = docker("save", "-o", str(archive), TAG, timeout=600)
            history = docker("history", "--no-trunc", TAG).stdout + docker("image", "inspect", TAG).stdout
        else:
            ref = image.removeprefix("sha256:")
            saved = podman("save", "--format", "oci-archive", "-o", str(archive), ref)
            history = podman("image", "inspect", ref).stdout + podman("history", "--no-trunc", ref).stdout
        assert saved.returncode == 0, saved.stderr
        hits = occurrences(archive, SECRET) + (["history/inspect"] if SECRET in history else [])
        probe = occurrences(archive, "dev.mbuild.plan")
    assert hits == []
    assert probe  # the same scan does find what is in the image


def test_oci_backend_builds_the_same_digest_twice(bases: Bases, minilm_hf_home: Path, tmp_path: Path) -> None:
    digests = []
    for run in ("first", "second"):  # two builds from scratch, each exporting and compiling anew
        package("oci", bases.oci, minilm_hf_home, tmp_path / run)
        digests.append(json.loads((tmp_path / run / "image.json").read_text())["digest"])
    assert digests[0] == digests[1] and digests[0].startswith("sha256:")
    package("oci", bases.oci, minilm_hf_home, tmp_path / "dated", env={"SOURCE_DATE_EPOCH": "1767225600"})
    assert json.loads((tmp_path / "dated" / "image.json").read_text())["digest"] != digests[0]


def _skopeo_digest(ref: str) -> str:
    out = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["Digest"])


@pytest.mark.parametrize("client", ["skopeo", "built-in"])
def test_push_keeps_the_digest_and_docker_runs_the_pulled_image(
        client: str, built: Built, bases: Bases, reference_embeddings: np.ndarray) -> None:
    build_dir = built.context  # its image.json names the oci build, the last one made
    local = built.records["oci"]["digest"]
    ref = f"{bases.registry}/mbuild-test/pushed-{client}:it"
    env = {}
    if client == "built-in":
        env["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                      if not (Path(p) / "skopeo").exists())
    result = mbuild("push", str(build_dir), ref, env=env)
    assert result.returncode == 0, result.stderr
    assert f"digest {local}" in result.stdout and ("built-in client" in result.stdout) == (client == "built-in")
    assert _skopeo_digest(ref) == local
    pulled = docker("pull", ref, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    try:
        with docker_run(ref) as url:
            body = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS[0]}, timeout=60).json()
            assert cosines(np.array([body["data"][0]["embedding"]]), reference_embeddings[:1]).min() >= 0.9999
    finally:
        docker("rmi", "-f", ref)


def test_deploy_and_inspect_read_a_pushed_image_from_its_registry(built: Built, bases: Bases) -> None:
    """`mbuild deploy REGISTRY/NAME:TAG` needs no build directory: the image's labels carry the plan's summary,
    and the manifest is written with the registry's digest. Only the manifest and config are fetched."""
    ref = f"{bases.registry}/mbuild-test/deployable:it"
    pushed = mbuild("push", str(built.context), ref)
    assert pushed.returncode == 0, pushed.stderr
    local = built.records["oci"]["digest"]
    inspected = mbuild("inspect", ref, "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["digest"] == local

    def deployment(*args: str) -> dict[str, Any]:
        result = mbuild("deploy", *args)
        assert result.returncode == 0, result.stderr
        return next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "Deployment")

    from_image = deployment(ref)["spec"]["template"]["spec"]["containers"][0]
    from_build = deployment(str(built.context))["spec"]["template"]["spec"]["containers"][0]
    assert from_image["image"] == f"{bases.registry}/mbuild-test/deployable@{local}"
    assert from_image["resources"] == from_build["resources"]
    assert from_image["readinessProbe"] == from_build["readinessProbe"]
    layout = f"oci:{built.context / 'oci'}"  # a local layout: no cluster pulls it, so --image is required
    refused = mbuild("deploy", layout)
    assert refused.returncode == 2 and "--image" in refused.stderr
    assert deployment(layout, "--image", from_image["image"])["spec"]["template"]["spec"]["containers"][0][
        "image"] == from_image["image"]


def test_inspect_shows_labels_validation_and_layers(built: Built) -> None:
    result = mbuild("inspect", str(built.context), "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["labels"]["dev.mbuild.profile"] == "onnxruntime-cpu-fp32-tp1-latency"
    assert len(found["labels"]["dev.mbuild.model.revision"]) == 40
    assert found["validation"]["passed"] is True
    made = [layer["created_by"] for layer in found["layers"]]
    assert [m.split(": ", 1)[-1] for m in made[-4:]] == [
        "COPY site /opt/mbuild/site", "COPY app /opt/mbuild/app", "COPY model /opt/mbuild/model",
        "COPY mbuild.lock bom.json /opt/mbuild/"]
