"""One build context, four image backends: each image runs, becomes healthy and serves MiniLM.

docker builds and `docker run`s; podman builds and `podman run`s; buildah builds and podman runs it
(shared containers-storage); the daemonless OCI writer's layout is unpacked by umoci and run by runc.
Every build gets a planted HF_TOKEN in its environment, and no image may carry it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.integration.conftest import TEXTS, Bases, cosines, tool
from tests.support.containers import docker
from tests.support.procs import mbuild
from tests.support.runners import docker_run, podman, podman_run, runc_run
from tests.support.scan import occurrences, scan_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "hf_PLANTEDsecretForTheScan0123456789"
BACKENDS = ("docker", "podman", "buildah", "oci")


def _base_for(backend: str, bases: Bases) -> str:
    return {"docker": bases.docker, "oci": bases.oci}.get(backend, bases.in_registry)


def package(backend: str, bases: Bases, hf_home: Path, out: Path, *extra: str, env: dict[str, str] | None = None,
            name: str | None = None) -> str:
    result = mbuild("package", "all-minilm-l6-v2", "--offline", "--backend", backend, "--base-image",
                    _base_for(backend, bases), "--name", name or f"mbuild-test/{backend}", "--version", "it",
                    "--output", str(out), *extra, env={"HF_HOME": str(hf_home), "HF_TOKEN": SECRET, **(env or {})})
    log = out / "image-build.log"
    assert result.returncode == 0, result.stderr + (log.read_text()[-3000:] if log.exists() else "")
    assert SECRET not in result.stderr + result.stdout
    return result.stderr


@pytest.fixture(scope="module")
def builds(bases: Bases, minilm_hf_home: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    made: dict[str, Path] = {}

    def build(backend: str) -> Path:
        if backend not in made:
            if backend in {"podman", "buildah"}:
                tool(backend, "info")
            out = tmp_path_factory.mktemp(f"build-{backend}")
            package(backend, bases, minilm_hf_home, out)
            made[backend] = out
        return made[backend]

    yield build
    docker("rmi", "-f", "mbuild-test/docker:it")
    for name in ("podman", "buildah"):
        if shutil.which("podman"):
            podman("rmi", "-f", f"localhost/mbuild-test/{name}:it")


def runner(backend: str, build_dir: Path, work: Path) -> AbstractContextManager[str]:
    tag = f"mbuild-test/{backend}:it"
    if backend == "docker":
        return docker_run(tag)
    if backend in {"podman", "buildah"}:
        return podman_run(f"localhost/{tag}")
    tool("umoci", "--version")
    tool("runc", "--version")
    return runc_run(build_dir / "oci", tag, work)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_builds_an_image_that_runs_healthy_and_serves(
        backend: str, builds: Callable[[str], Path], reference_embeddings: np.ndarray, tmp_path: Path) -> None:
    build_dir = builds(backend)
    record = json.loads((build_dir / "image.json").read_text())
    assert record["backend"] == backend
    with runner(backend, build_dir, tmp_path) as url:
        body = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "truncate": "END"}, timeout=60).json()
        assert cosines(np.array([d["embedding"] for d in body["data"]]), reference_embeddings).min() >= 0.9999


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_image_carries_the_planted_token(backend: str, builds: Callable[[str], Path], tmp_path: Path) -> None:
    build_dir = builds(backend)
    tag = f"mbuild-test/{backend}:it"
    if backend == "oci":
        hits = scan_tree(build_dir / "oci", SECRET)
    else:
        archive = tmp_path / "image.tar"
        if backend == "docker":
            saved = docker("save", "-o", str(archive), tag, timeout=600)
            history = docker("history", "--no-trunc", tag).stdout + docker("image", "inspect", tag).stdout
        else:
            saved = podman("save", "--format", "oci-archive", "-o", str(archive), f"localhost/{tag}")
            history = podman("image", "inspect", f"localhost/{tag}").stdout
        assert saved.returncode == 0, saved.stderr
        hits = occurrences(archive, SECRET) + (["history/inspect"] if SECRET in history else [])
    assert hits == []
    # The scan would have found it: the same scan sees a value that is in the image.
    probe = scan_tree(build_dir / "oci", "dev.mbuild.plan.digest") if backend == "oci" else occurrences(
        archive, "dev.mbuild.plan.digest")
    assert probe


def test_oci_backend_builds_the_same_digest_twice(bases: Bases, minilm_hf_home: Path, tmp_path: Path) -> None:
    digests = []
    for run in ("first", "second"):
        package("oci", bases, minilm_hf_home, tmp_path / run)
        digests.append(json.loads((tmp_path / run / "image.json").read_text())["digest"])
    assert digests[0] == digests[1] and digests[0].startswith("sha256:")
    package("oci", bases, minilm_hf_home, tmp_path / "dated", env={"SOURCE_DATE_EPOCH": "1767225600"})
    assert json.loads((tmp_path / "dated" / "image.json").read_text())["digest"] != digests[0]


def _skopeo_digest(ref: str) -> str:
    out = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["Digest"])


@pytest.mark.parametrize("client", ["skopeo", "built-in"])
def test_push_keeps_the_digest_and_docker_runs_the_pulled_image(
        client: str, builds: Callable[[str], Path], bases: Bases, reference_embeddings: np.ndarray) -> None:
    build_dir = builds("oci")
    local = json.loads((build_dir / "image.json").read_text())["digest"]
    ref = f"{bases.registry}/mbuild-test/pushed-{client}:it"
    env = {}
    if client == "built-in":
        env["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                      if not (Path(p) / "skopeo").exists())
    else:
        tool("skopeo", "--version")
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


def test_inspect_shows_labels_validation_and_layers(builds: Callable[[str], Path]) -> None:
    result = mbuild("inspect", str(builds("oci")), "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["labels"]["dev.mbuild.profile"] == "onnxruntime-cpu-fp32-tp1-latency"
    assert len(found["labels"]["dev.mbuild.model.revision"]) == 40
    assert found["validation"]["passed"] is True
    made = [layer["created_by"] for layer in found["layers"]]
    assert [m.split(": ", 1)[-1] for m in made[-4:]] == [
        "COPY site /opt/mbuild/site", "COPY app /opt/mbuild/app", "COPY model /opt/mbuild/model",
        "COPY mbuild.lock bom.json /opt/mbuild/"]
