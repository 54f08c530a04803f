"""Every image-reference form README and docs/ show works in `package --base-image`, `push` and `inspect`."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.image import push as push_module
from builder.oci.base import load_base
from builder.oci.basepython import check_python
from builder.oci.refs import parse_image_source
from tests.support.oci_images import PYTHON_BIN, docker_archive, fake_registry, make_layout, sha, tar_bytes

MBUILD_TAG = "mbuild/all-minilm-l6-v2:sha-0123456789ab"  # as mbuild names a build's image in BUILD_DIR/oci


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path / "mbuild-cache"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    monkeypatch.chdir(tmp_path)


def _oci_archive(layout_dir: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as tar:
        for path in sorted(layout_dir.rglob("*")):
            tar.add(path, arcname=path.relative_to(layout_dir).as_posix(), recursive=False)
    return out


def _docker_save(out: Path) -> Path:
    layer = tar_bytes(PYTHON_BIN)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [sha(layer)]}}).encode()
    return docker_archive(out, [{"Config": "config.json", "RepoTags": ["python:3.11-slim"],
                                 "Layers": ["abc/layer.tar"]}],
                          {"config.json": config, "abc/layer.tar": layer})


@pytest.fixture
def forms(tmp_path: Path) -> dict[str, str]:
    """Each documented form, backed by a real layout or archive in tmp_path."""
    make_layout(tmp_path / "base", tag="3.11")
    make_layout(tmp_path / "build" / "oci", tag=MBUILD_TAG)
    return {
        "oci:./base:3.11": "oci:./base:3.11",  # README: --base-image oci:./base:3.11
        "oci:PATH": f"oci:{tmp_path / 'base'}",
        "oci:PATH:TAG": f"oci:{tmp_path / 'base'}:3.11",
        "oci:BUILD_DIR/oci:TAG": f"oci:{tmp_path / 'build' / 'oci'}:{MBUILD_TAG}",  # docs/images.md, mbuild push
        "oci-archive:PATH": f"oci-archive:{_oci_archive(tmp_path / 'base', tmp_path / 'base.tar')}",
        "oci-archive:PATH:TAG": f"oci-archive:{tmp_path / 'base.tar'}:3.11",
        "docker-archive:PATH": f"docker-archive:{_docker_save(tmp_path / 'saved.tar')}",
    }


def test_the_parser_splits_paths_and_tags_that_hold_colons_and_slashes(tmp_path: Path) -> None:
    (tmp_path / "b:ld" / "oci").mkdir(parents=True)
    parsed = parse_image_source(f"oci:{tmp_path / 'b:ld' / 'oci'}:{MBUILD_TAG}")
    assert (parsed.kind, parsed.path, parsed.tag) == ("oci", tmp_path / "b:ld" / "oci", MBUILD_TAG)
    assert parse_image_source("oci:missing/oci:a/b:c").path == Path("missing/oci")  # skopeo's rule: first ':'
    assert parse_image_source("python:3.11-slim").kind == "name"
    assert parse_image_source(str(tmp_path)).kind == "dir"


@pytest.mark.parametrize("form", ["oci:./base:3.11", "oci:PATH", "oci:PATH:TAG", "oci:BUILD_DIR/oci:TAG",
                                  "oci-archive:PATH", "oci-archive:PATH:TAG", "docker-archive:PATH"])
def test_each_form_is_a_base_the_oci_writer_reads(forms: dict[str, str], form: str) -> None:
    base = load_base(forms[form])
    assert base.layers and base.config["os"] == "linux"
    check_python(base, "3.11")  # what the oci backend asks of a base before building on it


@pytest.mark.parametrize("form", ["oci:./base:3.11", "oci-archive:PATH:TAG", "docker-archive:PATH"])
def test_package_takes_each_form_as_base_image(forms: dict[str, str], form: str) -> None:
    result = CliRunner().invoke(cli, ["package", "all-minilm-l6-v2", "--backend", "none", "--plan-only",
                                      "--base-image", forms[form], "--output", "out"])
    assert result.exit_code == 0, result.output
    assert json.loads(Path("out/image-spec.json").read_text())["base_image"] == forms[form]


@pytest.mark.parametrize("form", ["oci:PATH:TAG", "oci:BUILD_DIR/oci:TAG", "oci-archive:PATH", "docker-archive:PATH"])
def test_inspect_reads_each_form(forms: dict[str, str], form: str) -> None:
    result = CliRunner().invoke(cli, ["inspect", forms[form], "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["digest"].startswith("sha256:") and len(shown["layers"]) == 1


@pytest.mark.parametrize("tool", ["built-in client", "skopeo"])
def test_push_of_a_build_dirs_layout_keeps_its_digest(forms: dict[str, str], tool: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if tool == "skopeo" and shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed")
    if tool != "skopeo":
        monkeypatch.setattr(push_module.shutil, "which", lambda name: None)
    with fake_registry() as registry:
        result = CliRunner().invoke(cli, ["push", forms["oci:BUILD_DIR/oci:TAG"], f"{registry.host}/team/minilm:1.0"])
        assert result.exit_code == 0, result.output
        assert f"pushed {registry.host}/team/minilm:1.0 with {tool}" in result.output
        assert "(same as the local image)" in result.output
        assert "1.0" in registry.manifests


@pytest.mark.parametrize("form", ["oci-archive:PATH:TAG", "docker-archive:PATH"])
def test_push_of_an_archive_goes_with_skopeo(forms: dict[str, str], form: str) -> None:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed")
    with fake_registry() as registry:
        result = CliRunner().invoke(cli, ["push", forms[form], f"{registry.host}/team/base:1"])
        assert result.exit_code == 0, result.output
        assert "1" in registry.manifests
