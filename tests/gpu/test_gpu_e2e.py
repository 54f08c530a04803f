"""The real GPU path: TensorRT engines built on this host's GPU, validated, and served.

Runs only where an NVIDIA GPU, TensorRT and cuda-python are present (tests/gpu/run.sh sets that up);
everywhere else it is skipped with the reason. Nothing else in the suite proves the TensorRT path.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from builder.planning.gpus import identify
from runtimes.bundle import load_engine_meta
from runtimes.engines import tensorrt_engine
from runtimes.hardware import detect_gpus
from tests.conftest import MINILM_REPO
from tests.support.procs import mbuild, served

pytestmark = pytest.mark.gpu
GPUS = detect_gpus()
MISSING = ("no NVIDIA GPU visible through NVML" if not GPUS else
           "TensorRT is not installed (pip install 'mbuild[tensorrt]')" if tensorrt_engine.trt_version() is None else
           "cuda-python is not installed" if tensorrt_engine.cudart is None else "")
if MISSING:
    pytest.skip(MISSING, allow_module_level=True)
GPU = identify(GPUS[0].name)
TEXTS = ["hello world", "TensorRT engines are bound to the GPU that builds them.", "déjà vu"]


@pytest.fixture(scope="module")
def gpu_build(minilm_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GPU is None:
        pytest.skip(f"{GPUS[0].name} is not a GPU mbuild has profiles for")
    home = tmp_path_factory.mktemp("hf")
    imported = mbuild("cache", "import", str(minilm_source), "--repo", MINILM_REPO, env={"HF_HOME": str(home)})
    assert imported.returncode == 0, imported.stderr
    out = tmp_path_factory.mktemp("gpu-minilm")
    result = mbuild("package", "all-minilm-l6-v2", "--offline", "--gpu", GPU.name, "--precision", "fp16",
                    "--backend", "none", "--output", str(out), env={"HF_HOME": str(home)}, timeout=3600)
    assert result.returncode == 0, result.stderr
    return out


def test_the_engine_was_built_for_this_gpu(gpu_build: Path) -> None:
    folder = gpu_build / "model" / "engines" / f"sm_{GPUS[0].compute_capability.replace('.', '')}"
    meta = load_engine_meta(folder / "engine-meta.json", "engine-meta.json")
    assert meta.device_name == GPUS[0].name and meta.tensorrt_version == tensorrt_engine.trt_version()
    assert (folder / "engine.plan").stat().st_size > 1000
    assert json.loads((gpu_build / "report.json").read_text())["passed"] is True


def test_served_fp16_embeddings_match_sentence_transformers(gpu_build: Path, minilm_source: Path) -> None:
    want = SentenceTransformer(str(minilm_source), device="cpu").encode(TEXTS)
    with served(gpu_build) as url:
        got = np.array([d["embedding"] for d in httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS},
                                                            timeout=60).json()["data"]])
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.999
