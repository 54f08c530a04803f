"""Each way of not getting a model ends in a clear message, a hint and its own exit code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.model.hubcache import repo_folder
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.net import free_port


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["package", *args, "--backend", "none", "--quiet"])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_unknown_repo(fake_hub: FakeHub) -> None:
    code, out = run("nobody/no-such-model")
    assert code == 3
    assert "no model 'nobody/no-such-model'" in out
    assert "HF_TOKEN" in out  # it may be private: says how to authenticate


def test_gated_repo_without_token(fake_hub: FakeHub, tiny_encoder: Path) -> None:
    fake_hub.repos["meta-llama/Llama-3.1-8B-Instruct"] = FakeRepo(tiny_encoder, gated=True)
    code, out = run("llama-3.1-8b")
    assert code == 4
    assert "gated" in out and "HF_TOKEN" in out
    assert f"{fake_hub.endpoint}/meta-llama/Llama-3.1-8B-Instruct" in out  # the page where the license is accepted


def test_unknown_revision(fake_hub: FakeHub, tiny_encoder: Path) -> None:
    fake_hub.repos["org/tiny"] = FakeRepo(tiny_encoder)
    code, out = run("org/tiny@no-such-branch")
    assert code == 3
    assert "no revision 'no-such-branch'" in out


def test_hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    code, out = run("org/anything")
    assert code == 5
    assert "cannot reach the Hugging Face Hub" in out
    assert "--offline" in out and "mbuild cache import" in out


def test_offline_and_not_cached() -> None:
    code, out = run("org/not-cached", "--offline")
    assert code == 6
    assert "not in the local Hugging Face cache" in out
    assert "mbuild cache import DIR --repo org/not-cached" in out


def test_hf_hub_offline_env_means_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _out = run("org/not-cached")
    assert code == 6


def test_incomplete_cached_snapshot_is_reported(tiny_encoder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_encoder, copy)
    CliRunner().invoke(cli, ["cache", "import", str(copy), "--repo", "org/tiny"], catch_exceptions=False)
    snapshot = next((repo_folder("org/tiny") / "snapshots").iterdir())
    (snapshot / "model.safetensors").unlink()
    code, out = run("org/tiny", "--offline")
    assert code == 7
    assert "no safetensors or PyTorch weights" in out


def test_bad_reference_is_a_usage_error() -> None:
    code, out = run("not a model")
    assert code == 2
    assert "not a valid model reference" in out or "unknown model alias" in out


def test_the_users_example_without_weights(fake_hub: FakeHub, tiny_encoder: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`mbuild package llama-3.1-8b`: gated without HF_TOKEN; unreachable Hub offline; not cached with --offline."""
    fake_hub.repos["meta-llama/Llama-3.1-8B-Instruct"] = FakeRepo(tiny_encoder, gated=True)
    code, out = run("llama-3.1-8b")
    assert code == 4 and "gated" in out and "HF_TOKEN" in out
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    code, out = run("llama-3.1-8b")
    assert code == 5 and "cannot reach the Hugging Face Hub" in out
    code, out = run("llama-3.1-8b", "--offline")
    assert code == 6 and "mbuild cache import DIR --repo meta-llama/Llama-3.1-8B-Instruct" in out
