"""Choosing a TensorRT engine for the device, and refusing with a reason when none fits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from runtimes.bundle import BundleError, EngineMeta
from runtimes.bundle.codec import write_contract
from runtimes.bundle.tensorrt import ShapeRange, TrtBuild
from runtimes.engines.gpu_select import built_engines, choose_engine
from runtimes.hardware import GpuInfo
from tests.support.bundles import edit_json

H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80)
L40S = GpuInfo("NVIDIA L40S", "8.9", 46)
A10G = GpuInfo("NVIDIA A10G", "8.6", 23)


BUILD = TrtBuild(precision_flags=("FP16",), strongly_typed=False, workspace_bytes=1 << 30, optimization_level=3,
                 hardware_compatibility="NONE", version_compatible=False,
                 profiles=({"input_ids": ShapeRange((1, 1), (4, 64), (8, 128))},))


def meta(cc: str, version: str, **build: Any) -> EngineMeta:
    return EngineMeta(tensorrt_version=version, compute_capability=cc, device_name=f"gpu {cc}", gpu_model="h100",
                      profile="tensorrt-h100-fp16-tp1-latency", build=dataclasses.replace(BUILD, **build),
                      timing_cache_sha256="0" * 64)


def bundle(tmp_path: Path, *engines: tuple[str, str, dict[str, Any]]) -> Path:
    for cc, version, build in engines:
        folder = tmp_path / "engines" / f"sm_{cc.replace('.', '')}"
        folder.mkdir(parents=True)
        (folder / "engine.plan").write_bytes(b"plan")
        write_contract(folder / "engine-meta.json", meta(cc, version, **build))
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


def test_engine_meta_is_read_back_as_written(tmp_path: Path) -> None:
    model = bundle(tmp_path, ("9.0", "10.13.0", {"version_compatible": True}))
    assert [e.meta for e in built_engines(model)] == [meta("9.0", "10.13.0", version_compatible=True)]
    written = json.loads((model / "engines" / "sm_90" / "engine-meta.json").read_text())
    assert next(iter(written)) == "format" and written["build"]["profiles"][0]["input_ids"]["max"] == [8, 128]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("format", 0, "engines/sm_90/engine-meta.json: it is format 0; this mbuild reads format 1"),
    ("format", ..., "engines/sm_90/engine-meta.json: an older mbuild wrote it, with no format field"),
    ("compute_capability", 9.0, "engines/sm_90/engine-meta.json: compute_capability must be a string (got 9.0)"),
    ("build.version_compatible", "yes", "engine-meta.json: build.version_compatible must be true or false"),
    ("build.hardware_compatibility", "ANY", "engine-meta.json: build.hardware_compatibility must be 'NONE' or"),
    ("build.optimization_level", 9, "engine-meta.json: build.optimization_level must lie between 0 and 5"),
    ("build.precision_flags", ["FP16", "TF64"], "engine-meta.json: build.precision_flags[1] must be 'FP16' or"),
    ("build.profiles", [{"input_ids": {"min": [1]}}], "engine-meta.json: build.profiles[0].input_ids.opt is missing"),
    ("build", ..., "engines/sm_90/engine-meta.json: build is missing"),
])
def test_an_engine_meta_of_another_format_or_ill_typed_is_refused(tmp_path: Path, field: str, value: object,
                                                                  says: str) -> None:
    """Before: a KeyError, or .get() defaults that called any engine version-incompatible and non-portable."""
    model = bundle(tmp_path, ("9.0", "10.13.0", {}))
    edit_json(model / "engines" / "sm_90" / "engine-meta.json", {field: value})
    with pytest.raises(BundleError) as caught:
        choose_engine(model, H100, "10.13.0")
    assert says in str(caught.value) and "rebuild the engine for this GPU" in str(caught.value)
