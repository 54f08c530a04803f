"""A host with no registry: --offline never contacts one, a base that is not here is refused before any download
or export with the fixes named, and a failed image build leaves its reason in image-build.log."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from builder.build.pipeline import _build_image
from builder.errors import BaseImageError, ImageBuildError
from builder.image.base import ImageResult
from builder.image.dockerfile_cli import DockerBackend
from builder.oci.base import load_base, registry_base_status
from tests.support.procs import mbuild


def test_offline_refuses_a_registry_base_it_never_pulled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(BaseImageError) as caught:
        load_base("registry.invalid/python:3.11-slim", offline=True)
    assert time.monotonic() - started < 1  # no connection was tried
    assert "registry.invalid/python:3.11-slim" in caught.value.message and "--offline" in caught.value.message
    assert "mbuild base" in (caught.value.hint or "") and "--backend none" in (caught.value.hint or "")
    assert registry_base_status("registry.invalid/python:3.11-slim", offline=True)[0] is False


def test_package_offline_stops_before_the_export_naming_base_and_fixes(tiny_encoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    result = mbuild("package", str(tiny_encoder), "--backend", "oci", "--offline", "--output", str(out),
                    "--base-image", "registry.invalid/python:3.11-slim", env={"MBUILD_CACHE": str(tmp_path / "c")},
                    timeout=300)
    assert result.returncode == 14, result.stderr
    assert "registry.invalid/python:3.11-slim" in result.stderr and "mbuild base" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(out.rglob("model.onnx"))  # refused before the export, not after the gate


def test_an_unreachable_registry_names_the_fixes_too(tiny_encoder: Path, tmp_path: Path) -> None:
    result = mbuild("package", str(tiny_encoder), "--backend", "oci", "--output", str(tmp_path / "b"),
                    "--base-image", "127.0.0.1:9/python:3.11-slim", env={"MBUILD_CACHE": str(tmp_path / "c"),
                                                                         "MBUILD_INSECURE_REGISTRIES": "127.0.0.1:9"},
                    timeout=300)
    assert result.returncode == 14, result.stderr
    assert "cannot pull the base image 127.0.0.1:9/python:3.11-slim" in result.stderr
    assert "mbuild base" in result.stderr and "Traceback" not in result.stderr


class Failing:
    name = "failing"

    def build(self, context: Path, tag: str, log_file: Path) -> ImageResult:
        log_file.write_text("step 1/3\n")
        raise ImageBuildError("the engine ran out of disk", hint="free some space")


def test_a_failed_image_build_leaves_its_reason_in_the_log(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError) as caught:
        _build_image(Failing(), tmp_path, "x:1")  # type: ignore[arg-type]
    log = (tmp_path / "image-build.log").read_text()
    assert log.startswith("step 1/3") and "error: the engine ran out of disk" in log and "hint: free some space" in log
    assert str(tmp_path / "image-build.log") in (caught.value.hint or "")


def test_offline_a_cli_backend_must_already_hold_a_registry_base() -> None:
    """docker, podman and buildah pull a missing base themselves at build time; offline, that is refused first."""
    with pytest.raises(BaseImageError) as caught:
        DockerBackend(offline=True).check_base("registry.invalid/python:3.11-slim", "3.11")
    assert "--offline forbids pulling it" in caught.value.message and "mbuild base" in (caught.value.hint or "")
    DockerBackend(offline=False).check_base("registry.invalid/python:3.11-slim", "3.11")  # it may pull
    DockerBackend(offline=True).check_base("oci:/some/layout:tag", "3.11")  # a local base needs no registry
