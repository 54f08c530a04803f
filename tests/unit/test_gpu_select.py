"""Choosing a TensorRT engine for the device, and refusing with a reason when none fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtimes.bundle import BundleError
from runtimes.engines.gpu_select import choose_engine
from runtimes.hardware import GpuInfo

H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80)
L40S = GpuInfo("NVIDIA L40S", "8.9", 46)
A10G = GpuInfo("NVIDIA A10G", "8.6", 23)


def bundle(tmp_path: Path, *engines: tuple[str, str, dict[str, object]]) -> Path:
    for cc, version, settings in engines:
        folder = tmp_path / "engines" / f"sm_{cc.replace('.', '')}"
        folder.mkdir(parents=True)
        (folder / "engine.plan").write_bytes(b"plan")
        (folder / "engine-meta.json").write_text(json.dumps(
            {"compute_capability": cc, "tensorrt_version": version, "device_name": f"gpu {cc}", "settings": settings}))
    return tmp_path


def test_picks_the_engine_for_this_gpu(tmp_path: Path) -> None:
    model = bundle(tmp_path, ("9.0", "10.13.0.35", {}), ("8.9", "10.13.0.35", {}))
    assert choose_engine(model, H100, "10.13.2").folder.name == "sm_90"
    assert choose_engine(model, L40S, "10.13.0").folder.name == "sm_89"


def test_a_gpu_with_no_engine_is_refused_with_what_to_do(tmp_path: Path) -> None:
    model = bundle(tmp_path, ("9.0", "10.13.0", {}), ("8.9", "10.13.0", {}))
    with pytest.raises(BundleError) as info:
        choose_engine(model, A10G, "10.13.0")
    message = str(info.value)
    assert "built for sm_89 (gpu 8.9), sm_90 (gpu 9.0)" in message and "NVIDIA A10G" in message
    assert "sm_86" in message and "--gpu" in message


def test_another_tensorrt_version_is_refused(tmp_path: Path) -> None:
    model = bundle(tmp_path, ("9.0", "10.13.0", {}))
    with pytest.raises(BundleError, match=r"built with TensorRT 10\.13\.0, but this image runs TensorRT 10\.11"):
        choose_engine(model, H100, "10.11.0")


def test_version_compatible_and_ampere_plus_engines_travel(tmp_path: Path) -> None:
    model = bundle(tmp_path, ("9.0", "10.13.0", {"version_compatible": True, "hardware_compatibility": "AMPERE_PLUS"}))
    assert choose_engine(model, H100, "10.14.1").folder.name == "sm_90"
    assert choose_engine(model, A10G, "10.13.0").folder.name == "sm_90"  # built portable for Ampere and newer


@pytest.mark.parametrize(("gpu", "version", "message"), [
    (None, "10.13.0", "no NVIDIA GPU is visible"),
    (H100, None, "tensorrt package is not importable"),
])
def test_missing_gpu_or_tensorrt(tmp_path: Path, gpu: GpuInfo | None, version: str | None, message: str) -> None:
    with pytest.raises(BundleError, match=message):
        choose_engine(bundle(tmp_path, ("9.0", "10.13.0", {})), gpu, version)


def test_no_engines_at_all(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no TensorRT engine"):
        choose_engine(tmp_path, H100, "10.13.0")
