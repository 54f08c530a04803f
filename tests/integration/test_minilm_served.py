"""The main job: the real MiniLM, from an imported cache, offline, packaged and served on this host."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.integration.conftest import TEXTS, cosines
from tests.support.procs import mbuild, served

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_build(minilm_hf_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("minilm-build")
    result = mbuild("package", "all-minilm-l6-v2", "--offline", "--backend", "none", "--output", str(out),
                    env={"HF_HOME": str(minilm_hf_home)})
    assert result.returncode == 0, result.stderr
    for stage in ("resolve", "download", "export", "compile", "validate", "context", "image"):
        assert stage in result.stderr  # each stage reported, with its time in the summary
    assert "build dir" in result.stderr and str(out) in result.stderr
    return out


def test_build_dir_holds_a_passing_report_and_lock(minilm_build: Path) -> None:
    report = json.loads((minilm_build / "report.json").read_text())
    assert report["passed"] is True and report["min_cosine"] >= 0.9999
    assert len(report["inputs"]) >= 8 and max(i["tokens"] for i in report["inputs"]) == 256  # one was truncated
    lock = json.loads((minilm_build / "mbuild.lock").read_text())
    weights = [f for f in lock["model"]["files"] if f["path"] == "model.safetensors"]
    assert weights and len(weights[0]["sha256"]) == 64
    assert not any(f["path"].endswith(".bin") for f in lock["model"]["files"])  # safetensors preferred
    assert (minilm_build / "Dockerfile").is_file() and any((minilm_build / "site").glob("onnxruntime-*.dist-info"))


def test_served_embeddings_equal_sentence_transformers(minilm_build: Path, reference_embeddings: np.ndarray) -> None:
    with served(minilm_build) as url:
        assert httpx.get(f"{url}/v1/health/ready").status_code == 200
        body = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "truncate": "END"}).json()
        got = np.array([d["embedding"] for d in body["data"]])
        assert cosines(got, reference_embeddings).min() >= 0.9999

        with OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
            result = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=TEXTS[:2])
        sdk = np.array([d.embedding for d in result.data])
        assert sdk.shape == (2, 384)
        assert cosines(sdk, reference_embeddings[:2]).min() >= 0.9999
        assert result.usage.prompt_tokens > 0
