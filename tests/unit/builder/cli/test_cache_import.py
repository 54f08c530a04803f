"""`mbuild cache import` writes the standard layout that huggingface_hub finds offline."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from builder.cli import cli
from builder.errors import InputError
from builder.model.cache_import import import_folder
from builder.model.hubcache import hub_cache_dir, repo_folder


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_round_trip_offline_snapshot_download(tiny_encoder: Path) -> None:
    result = CliRunner().invoke(cli, ["cache", "import", str(tiny_encoder), "--repo", "org/tiny"])
    assert result.exit_code == 0, result.output
    assert "imported" in result.output and "org/tiny@" in result.output
    folder = snapshot_download("org/tiny", local_files_only=True, cache_dir=hub_cache_dir())
    assert _tree(Path(folder)) == _tree(tiny_encoder)
    sha = (repo_folder("org/tiny") / "refs" / "main").read_text()
    assert Path(folder).name == sha and len(sha) == 40


def test_layout_is_symlinks_into_blobs(tiny_encoder: Path) -> None:
    result = import_folder(tiny_encoder, "org/tiny")
    link = result.snapshot / "1_Pooling" / "config.json"
    assert link.is_symlink()
    assert not os.path.isabs(os.readlink(link))  # relative, as the Hub client writes them
    assert link.resolve().parent == repo_folder("org/tiny") / "blobs"
    weights = (result.snapshot / "model.safetensors").resolve()
    assert len(weights.name) == 64  # LFS files are named by sha256


def test_explicit_revision_and_idempotence(tiny_encoder: Path) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    first = import_folder(tiny_encoder, "org/tiny", revision=sha)
    second = import_folder(tiny_encoder, "org/tiny", revision=sha)
    assert first.snapshot == second.snapshot
    assert snapshot_download("org/tiny", revision=sha, local_files_only=True, cache_dir=hub_cache_dir())


def test_derived_revision_is_stable(tiny_encoder: Path) -> None:
    assert import_folder(tiny_encoder, "org/a").sha == import_folder(tiny_encoder, "org/b").sha


def test_other_repos_stay_missing(tiny_encoder: Path) -> None:
    import_folder(tiny_encoder, "org/tiny")
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download("org/other", local_files_only=True, cache_dir=hub_cache_dir())


@pytest.mark.parametrize(("repo", "revision", "message"), [
    ("not-a-repo", None, "org/name"),
    ("org/tiny", "abc", "40-character"),
])
def test_bad_arguments(tiny_encoder: Path, repo: str, revision: str | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        import_folder(tiny_encoder, repo, revision)


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    result = CliRunner().invoke(cli, ["cache", "import", str(tmp_path), "--repo", "org/x"])
    assert result.exit_code == 2
    assert "no config.json" in result.output


def _special(kind: str, path: Path) -> None:
    """Make a file that is not a regular one at path: what a careless copy or a hostile folder may hold."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # what /dev/zero is
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "dangling link":
        path.symlink_to(path.with_name("gone.bin"))
    elif kind == "looping link":
        path.symlink_to(path.name)
    elif kind == "link to a folder":
        (path.parent / "real").mkdir()
        (path.parent / "real" / "weights.bin").write_bytes(b"w")
        path.symlink_to("real")
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize(("kind", "code", "words"), [
    ("fifo", 2, "named pipe"),
    ("socket", 2, "socket"),
    ("device", 2, "character device"),
    ("dangling link", 2, "does not exist"),
    ("looping link", 2, "loop"),
    ("link to a folder", 2, "link to a folder"),
    ("link to /dev/zero", 15, "character device"),
])
def test_a_file_that_is_not_a_regular_one_is_refused_by_name(tmp_path: Path, kind: str, code: int,
                                                             words: str) -> None:
    """Nothing is silently left out: a FIFO, a device, a socket or a link that leads nowhere is an error that
    names the file and what it is, before anything is read (a FIFO or /dev/zero would never end) or written."""
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").write_bytes(b"w" * 100)
    _special(kind, model / "sub" / "tokenizer.json")
    result = CliRunner().invoke(cli, ["cache", "import", str(model), "--repo", "org/special"])
    assert result.exit_code == code, result.output
    assert "sub/tokenizer.json" in result.output and words in result.output and "hint:" in result.output
    assert "next:" not in result.output and "Traceback" not in result.output
    assert not repo_folder("org/special").exists()


def test_special_files_in_dot_folders_are_not_model_content(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / ".cache").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    os.mkfifo(model / ".cache" / "lock")
    assert import_folder(model, "org/dotted").files == 1
