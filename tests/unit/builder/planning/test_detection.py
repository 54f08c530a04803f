"""Hardware detection: NVML faked at its one edge (no GPU here); the CPU read for real."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.planning import target as target_module
from builder.planning.target import detected_target, resolve_target
from runtimes.hardware import GpuInfo, detect_gpus


class FakeNvml:
    """The handful of pynvml calls detection makes, answering like a host with these GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: list[tuple[str, tuple[int, int], int]], fail_init: bool = False) -> None:
        self.devices, self.fail_init, self.shutdown = devices, fail_init, False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return self.devices[handle][0].encode()  # older bindings return bytes

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.devices[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=self.devices[handle][2] * 1024**3)


def test_nvml_gpus_become_a_cuda_target() -> None:
    nvml = FakeNvml([("NVIDIA H100 80GB HBM3", (9, 0), 80)] * 2)
    found = detect_gpus(nvml)
    assert found == (GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80.0),) * 2 and nvml.shutdown
    target = detected_target(found)
    assert target.kind == "cuda" and len(target.gpus) == 2
    assert (target.gpus[0].model, target.gpus[0].compute_capability) == ("h100", "9.0")


def test_l40s_is_not_mistaken_for_an_l4() -> None:
    target = detected_target(detect_gpus(FakeNvml([("NVIDIA L40S", (8, 9), 46)])))
    assert target.gpus[0].model == "l40s"


def test_no_driver_is_a_cpu_target_not_an_error() -> None:
    assert detect_gpus(FakeNvml([], fail_init=True)) == ()
    assert detected_target(()).kind == "cpu"


def test_named_targets() -> None:
    two = resolve_target("h100x2")
    assert (two.kind, len(two.gpus), two.gpus[0].memory_gb, two.source) == ("cuda", 2, 80, "--gpu h100x2")
    assert resolve_target("cpu").kind == "cpu"


def test_detected_gpus_feed_profile_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target_module, "detect_gpus", lambda: detect_gpus(FakeNvml([("NVIDIA L4", (8, 9), 23)])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(cli, ["profiles", "llama-3.1-8b", "--json"])  # no --gpu: detect
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["selected"] == "tensorrt-l4-fp8-tp1-throughput"


def test_doctor_reports_this_cpu_truthfully() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    flags_line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    real_flags = set(flags_line.split(":", 1)[1].split())
    assert set(info["cpu"]["flags"]) == real_flags & {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                                                      "avx_vnni", "amx_tile", "amx_int8"}
    assert info["cpu"]["cores"] == len(os.sched_getaffinity(0))
    mem_kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")).split()[1])
    assert abs(info["ram_gb"] - mem_kb / 1024**2) < 0.1
    assert info["gpus"] == []  # this machine has none
    assert info["hf_token"] == "not set"


def test_doctor_never_prints_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0
    assert "hf_secret_value_123" not in result.output
    assert "HF_TOKEN" in result.output and "set" in result.output


def test_doctor_tells_whether_the_default_base_can_be_had(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A registry that does not answer and no pull kept: images need `mbuild base`, or cannot be built at all."""
    doctor = importlib.import_module("builder.cli.doctor")  # the module: builder.cli's `doctor` is the command
    monkeypatch.setattr(doctor, "DEFAULT_BASE_IMAGE", "127.0.0.1:9/python:3.11-slim")
    monkeypatch.setenv("MBUILD_INSECURE_REGISTRIES", "127.0.0.1:9")
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path))
    monkeypatch.setattr(doctor, "bootstrap_tool", lambda: "mmdebstrap")
    info = doctor.gather()
    assert info["base_image"]["usable"] is False and "does not answer" in info["base_image"]["why"]
    images = info["can_build"]["images"]
    assert images.startswith("no image backend") or "once `mbuild base` makes a base" in images
    monkeypatch.setattr(doctor, "bootstrap_tool", lambda: None)
    images = doctor.gather()["can_build"]["images"]
    assert images.startswith(("no image backend", "no: 127.0.0.1:9/python:3.11-slim"))
