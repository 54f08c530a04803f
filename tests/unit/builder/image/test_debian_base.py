"""`mbuild base`'s layer and layout, from a root filesystem made here (the mirror step is the integration
suite's): byte-identical twice, modes and links as installed, nothing a serving image never needs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.errors import ToolMissing
from builder.image import debian_base
from builder.image.debian_base import prune, write_layout
from builder.image.load import write_archive
from builder.oci.base import load_base
from builder.oci.basepython import check_python
from builder.oci.layout import Layout

EPOCH = 1_700_000_000


def fake_rootfs(root: Path) -> Path:
    (root / "usr" / "bin").mkdir(parents=True)
    python = root / "usr" / "bin" / "python3.11"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    os.link(python, root / "usr" / "bin" / "python3.11-hardlink")
    (root / "usr" / "bin" / "python3").symlink_to("python3.11")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr" / "bin" / "su").write_text("setuid")
    (root / "usr" / "bin" / "su").chmod(0o4755)
    (root / "tmp").mkdir()
    (root / "tmp" / "left-over").write_text("x")
    (root / "tmp").chmod(0o1777)
    for pruned in ("var/lib/apt/lists/deb.debian.org_dists", "usr/lib/python3.11/__pycache__/os.cpython-311.pyc"):
        (root / pruned).parent.mkdir(parents=True, exist_ok=True)
        (root / pruned).write_text("changes every install")
    (root / "usr" / "lib" / "python3.11" / "os.py").write_text("# stdlib")
    (root / "etc").mkdir()
    (root / "etc" / "machine-id").write_text("0123456789abcdef\n")
    future = root / "etc" / "future"
    future.write_text("made after the epoch")
    os.utime(future, (time.time(), time.time()))
    os.mkfifo(root / "tmp-fifo")
    return root


@pytest.fixture
def layouts(tmp_path: Path) -> tuple[tuple[Path, str], tuple[Path, str]]:
    made = []
    for n in (1, 2):
        root = fake_rootfs(tmp_path / f"root{n}")
        prune(root)
        made.append((tmp_path / f"layout{n}", write_layout(root, tmp_path / f"layout{n}", "bookworm-python3", EPOCH,
                                                           "test")))
    return made[0], made[1]


def test_the_same_tree_gives_the_same_digest(layouts: tuple[tuple[Path, str], tuple[Path, str]]) -> None:
    (_, first), (_, second) = layouts
    assert first == second and first.startswith("sha256:")


def test_the_layer_keeps_modes_and_links_and_drops_what_an_image_never_needs(
        layouts: tuple[tuple[Path, str], tuple[Path, str]]) -> None:
    folder, _ = layouts[0]
    image = load_base(f"oci:{folder}:bookworm-python3")  # the builder reads it as any other base
    ((_, blob),) = image.layers
    with tarfile.open(blob, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert stat.S_IMODE(members["usr/bin/su"].mode) == 0o4755
    assert stat.S_IMODE(members["tmp"].mode) == 0o1777 and "tmp/left-over" not in members
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    linked = [members["usr/bin/python3.11"], members["usr/bin/python3.11-hardlink"]]
    assert sorted(m.type for m in linked) == sorted([tarfile.REGTYPE, tarfile.LNKTYPE])
    assert "tmp-fifo" not in members
    assert not any("__pycache__" in name for name in members) and "usr/lib/python3.11/os.py" in members
    assert "var/lib/apt/lists/deb.debian.org_dists" not in members
    assert members["etc/machine-id"].size == 0
    assert all(m.mtime <= EPOCH for m in members.values())
    assert all(m.uname == "" and m.gname == "" for m in members.values())
    assert image.config["config"]["Cmd"] == ["python3"]
    check_python(image, "3.11")  # no error: the runtime could start in it


def test_no_bootstrap_tool_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path))
    with pytest.raises(ToolMissing, match="mmdebstrap"):
        debian_base.make_base()


def test_load_streams_the_layout_as_the_archive_engines_load(layouts: tuple[tuple[Path, str], tuple[Path, str]],
                                                             tmp_path: Path) -> None:
    """`mbuild load`'s archive: docker save's manifest.json naming the config and uncompressed layers whose
    sha256 are the config's diff_ids (what docker and podman check on load)."""
    folder, digest = layouts[0]
    archive = tmp_path / "image.tar"
    with archive.open("wb") as sink:
        assert write_archive(Layout(folder), "bookworm-python3", "mbuild-local/python:3.11", sink) == digest
    with tarfile.open(archive) as tar:
        (entry,) = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(entry["Config"]).read())  # type: ignore[union-attr]
        layers = ["sha256:" + hashlib.sha256(tar.extractfile(name).read()).hexdigest()  # type: ignore[union-attr]
                  for name in entry["Layers"]]
    assert entry["RepoTags"] == ["mbuild-local/python:3.11"]
    assert layers == config["rootfs"]["diff_ids"]


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--mirror", "ftp://deb.debian.org/debian", "http"),
    ("--mirror", "file:///etc", "http"),
    ("--mirror", "http://deb.debian.org/debian\nhttp://evil.example/", "whitespace"),
    ("--mirror", "http://deb.debian.org/deb ian", "whitespace"),
    ("--mirror", "http:///debian", "host"),
    ("--mirror", "https://deb.debian.org:99999/debian", "port"),
    ("--mirror", "deb http://deb.debian.org/debian bookworm main", "http"),
    ("--suite", "--variant=extract", "suite"),
    ("--suite", "../../../../tmp/x", "suite"),
    ("--package", "python3,evil", "package"),
    ("--package", "-oAPT::Get=1", "package"),
])
def test_bad_mirrors_suites_and_packages_are_refused_before_the_bootstrap_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, option: str, value: str, words: str) -> None:
    """mmdebstrap would take most of these and fail with only "mmdebstrap failed" (or read a local folder as the
    mirror, or an option): each is a clear error naming the option, and nothing runs or is written."""
    ran: list[list[str]] = []
    monkeypatch.setattr(debian_base.subprocess, "run", lambda command, **_: ran.append(command))
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("MBUILD_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["base", option, value])
    assert result.exit_code == 2, result.output
    assert option in result.output and words in result.output and "hint:" in result.output, result.output
    assert not ran and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("mirror", ["http://deb.debian.org/debian", "https://snapshot.debian.org/archive/debian/"
                                    "20240101T000000Z/", "http://10.0.0.5:3142/debian", "https://user:pw@m.example/"])
def test_http_mirrors_are_taken(mirror: str) -> None:
    debian_base.check_inputs("bookworm-backports", mirror, ("python3", "ca-certificates", "libc6:amd64=2.36-9"))
