"""The container refuses hardware its profile was not built for: a clear message and a non-zero exit."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from runtimes.__main__ import choose_profile
from runtimes.bundle import Requirements
from runtimes.fit import misfits
from runtimes.hardware import GpuInfo

H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80)
L4 = GpuInfo("NVIDIA L4", "8.9", 23)
GPU_REQ = Requirements(device="gpu", cpu_flags=(), memory_gb=20, python="3.12", gpus=1, compute_capabilities=("9.0",),
                       gpu_models=("h100",))


def cpu_req(flags: tuple[str, ...], memory_gb: float) -> Requirements:
    return Requirements(device="cpu", cpu_flags=flags, memory_gb=memory_gb, python="3.12", gpus=0,
                        compute_capabilities=(), gpu_models=())


def test_a_matching_host_fits() -> None:
    assert misfits(GPU_REQ, frozenset(), [H100], 64) == []
    assert misfits(cpu_req(("avx2",), 2), frozenset({"avx2"}), [], 8) == []


def test_compute_capability_mismatch_says_rebuild() -> None:
    (problem,) = misfits(GPU_REQ, frozenset(), [L4], 64)
    assert "built for compute capability 9.0" in problem and "NVIDIA L4 is 8.9" in problem and "--gpu" in problem
    both = dataclasses.replace(GPU_REQ, compute_capabilities=("9.0", "8.9"), gpu_models=("h100", "l4"))
    assert misfits(both, frozenset(), [L4], 64) == []  # an image with an engine for each


def test_missing_gpus_memory_and_flags() -> None:
    assert "1 NVIDIA GPU(s)" in misfits(GPU_REQ, frozenset(), [], 64)[0]
    assert "needs 90 GB per GPU" in misfits(dataclasses.replace(GPU_REQ, memory_gb=90), frozenset(), [H100], 64)[0]
    cpu = misfits(cpu_req(("avx512_vnni",), 30), frozenset({"avx2"}), [], 16)
    assert any("avx512_vnni" in p for p in cpu) and any("needs 30 GB of memory" in p for p in cpu)


def test_the_runtime_exits_4_on_a_host_without_the_profiles_cpu_flags(tiny_build: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_build / "model", model)
    meta = json.loads((model / "metadata.json").read_text())
    meta["requires"]["cpu_flags"] = ["avx2", "amx_fp64_from_the_future"]
    (model / "metadata.json").write_text(json.dumps(meta))
    env = {**os.environ, "MBUILD_MODEL_DIR": str(model), "MBUILD_PORT": "1"}
    result = subprocess.run([sys.executable, "-m", "runtimes"], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert result.returncode == 4
    assert "refusing to start" in result.stderr and "amx_fp64_from_the_future" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_broken_bundle_exits_3(tmp_path: Path) -> None:
    env = {**os.environ, "MBUILD_MODEL_DIR": str(tmp_path / "nowhere")}
    result = subprocess.run([sys.executable, "-m", "runtimes"], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert result.returncode == 3 and "does not exist" in result.stderr


def test_the_image_lists_its_profiles_and_refuses_one_it_does_not_carry(tiny_build: Path) -> None:
    """NIM's list-model-profiles and NIM_MODEL_PROFILE, on the image's entry point."""
    profile = json.loads((tiny_build / "model" / "metadata.json").read_text())["profile"]
    env = {**os.environ, "MBUILD_MODEL_DIR": str(tiny_build / "model")}

    def runtime(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runtimes", *args], capture_output=True, text=True,
                              env={**env, **extra}, timeout=60, check=False)

    listed = runtime("--list-model-profiles")
    assert listed.returncode == 0 and profile["id"][:12] in listed.stdout and profile["name"] in listed.stdout
    assert "runnable here" in listed.stdout
    for carried in (profile["name"], profile["id"], profile["id"][:12]):
        choose_profile(tiny_build / "model", carried)  # the image's own profile: no complaint
    other = runtime(NIM_MODEL_PROFILE="tensorrt-h100-fp8-tp1-latency", MBUILD_PORT="1")
    assert other.returncode == 3 and "is not in this image; it carries: " + profile["name"] in other.stderr
    assert "Traceback" not in other.stderr
