"""The GPU side that needs no TensorRT: what NVML reports of a real GPU becomes mbuild's target, its plan, and the
energy `mbuild bench` reads.

Runs where NVML sees an NVIDIA GPU (skipped elsewhere, with the reason); the unit tests fake NVML at its one edge
(runtimes/hardware.py), so only this proves the real library's answers are read right. Torch, where it is installed
with CUDA, cross-checks NVML's facts and loads the GPU while its energy counter is read. Without the repository's
other test dependencies: `python3 -m pytest --confcutdir tests/gpu -o addopts= tests/gpu/test_nvml_target.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from builder.benchmark.energy import meter
from builder.planning.gpus import identify
from runtimes.hardware import detect_gpus

pytestmark = pytest.mark.gpu
GPUS = detect_gpus()
if not GPUS:
    pytest.skip("no NVIDIA GPU visible through NVML", allow_module_level=True)


def _cuda() -> object:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA")
    return torch


def test_nvml_reports_what_the_device_itself_does() -> None:
    torch = _cuda()
    for index, gpu in enumerate(GPUS):
        props = torch.cuda.get_device_properties(index)  # type: ignore[attr-defined]
        assert gpu.compute_capability == f"{props.major}.{props.minor}"
        assert abs(gpu.memory_gb - props.total_memory / 1024**3) <= 0.01 * gpu.memory_gb
        assert gpu.name == props.name, (gpu.name, props.name)
    print(f"NVML: {[(g.name, g.compute_capability, g.memory_gb) for g in GPUS]}")


def test_a_plan_on_this_host_targets_its_gpu_with_a_tensorrt_profile() -> None:
    """`mbuild plan` with no --gpu detects: the first GPU is one mbuild knows (profiles/gpus.yaml), and the plan
    builds a TensorRT engine for its compute capability (no hub needed: the catalog holds the model's facts)."""
    known = identify(GPUS[0].name)
    assert known is not None, f"{GPUS[0].name} is not in profiles/gpus.yaml"
    done = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "llama-3.1-8b", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    target, profile = plan["target"], plan["profile"]
    assert target["kind"] == "cuda" and target["source"] == "detected"
    assert target["gpus"][0]["model"] == known.name
    assert target["gpus"][0]["compute_capability"] == GPUS[0].compute_capability
    assert profile["content"]["engine"] == "tensorrt"
    print(f"plan: {profile['name']} for {target['gpus'][0]}; {profile.get('why', [])[:3]}")


def test_the_energy_meter_reads_the_gpu_working() -> None:
    """NVML's energy counter over two seconds of matrix products: joules at a power this GPU can draw."""
    torch = _cuda()
    reading = meter(local=True)
    assert reading.read is not None and "NVML" in reading.how, reading.how
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)  # type: ignore[attr-defined]

    def work() -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < 2.0:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()  # type: ignore[attr-defined]
        return time.perf_counter() - started

    seconds, joules = reading.measure(work)
    assert joules is not None
    watts = joules / seconds
    print(f"energy: {joules:.0f} J over {seconds:.2f} s, {watts:.0f} W ({reading.how})")
    assert 30 * len(GPUS) <= watts <= 1500 * len(GPUS)
