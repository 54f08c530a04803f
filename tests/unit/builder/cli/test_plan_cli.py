"""`mbuild plan`: byte-identical for the same inputs; any input changed, a new digest; nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from builder.cli import cli

ROOT = Path(__file__).resolve().parents[4]


def plan(*args: str, cwd: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "builder.cli", "plan", *args], capture_output=True, text=True,
                            env=env, cwd=cwd, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def digest(*args: str, cwd: Path) -> str:
    return str(json.loads(plan(*args, "--json", cwd=cwd))["digest"])


def test_two_runs_print_byte_identical_plans(tmp_path: Path) -> None:
    first = plan("llama-3.1-8b", "--gpu", "h100", cwd=tmp_path)
    assert first == plan("llama-3.1-8b", "--gpu", "h100", cwd=tmp_path)
    assert first.startswith("plan ") and "tensorrt-h100-fp8-tp1-throughput" in first
    as_json = plan("llama-3.1-8b", "--gpu", "h100", "--json", cwd=tmp_path)
    assert as_json == plan("llama-3.1-8b", "--gpu", "h100", "--json", cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("change", [
    ["meta-llama/Llama-3.1-8B-Instruct@another-branch", "--gpu", "h100"],
    ["llama-3.1-8b", "--gpu", "h100", "--profile", "tensorrt-h100-bf16-tp1-throughput"],
    ["llama-3.1-8b", "--gpu", "h100", "--base-image", "registry.local/tensorrt:custom"],
    ["llama-3.1-8b", "--gpu", "h100", "--name", "acme/llama"],
    ["llama-3.1-8b", "--gpu", "h100", "--precision", "bf16"],
])
def test_changing_an_input_changes_the_digest(tmp_path: Path, change: list[str]) -> None:
    assert digest(*change, cwd=tmp_path) != digest("llama-3.1-8b", "--gpu", "h100", cwd=tmp_path)


def test_mbuild_profile_env_picks_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MBUILD_PROFILE", "tensorrt-h100-bf16-tp1-latency")
    data = json.loads(plan("llama-3.1-8b", "--gpu", "h100", "--json", cwd=tmp_path))
    assert data["profile"]["name"] == "tensorrt-h100-bf16-tp1-latency"
    assert data["profile"]["why"] == ["profile tensorrt-h100-bf16-tp1-latency: asked for (--profile / MBUILD_PROFILE)"]


def test_the_users_example_plans_offline_from_the_catalog(tmp_path: Path) -> None:
    data = json.loads(plan("llama-3.1-8b", "--json", cwd=tmp_path))
    assert data["model"]["repo"] == "meta-llama/Llama-3.1-8B-Instruct" and data["model"]["resolved"] is False
    assert data["facts"]["params"] == pytest.approx(8.03, abs=0.005) and data["task"] == "text-generation"
    assert data["profile"]["name"].startswith("onnxruntime-cpu") or data["target"]["kind"] == "cuda"


def test_with_dynamo_puts_dynamo_into_the_image_as_pyproject_pins_it(tmp_path: Path) -> None:
    """The image's Dynamo is the one `pip install mbuild[dynamo]` gets here (one version in both places), ai-dynamo
    installed again without its dependencies; the plan (and its digest) says so, and a plan without it is
    unchanged by the option existing."""
    data = json.loads(plan("llama-3.1-8b", "--with", "dynamo", "--json", cwd=tmp_path))
    plain = json.loads(plan("llama-3.1-8b", "--json", cwd=tmp_path))
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dynamo"]
    assert data["extras"] == ["dynamo"] and data["runtime"]["extras"] == ["dynamo"]
    assert data["runtime"]["requirements"] == plain["runtime"]["requirements"] + extra
    assert data["runtime"]["no_deps"] == [extra[0], extra[0].replace("-runtime", "")]
    assert data["digest"] != plain["digest"] and "extras" not in plain and "extras" not in plain["runtime"]
    assert "with       dynamo (then without dependencies: ai-dynamo-runtime==1.6.1, ai-dynamo==1.6.1)" in plan(
        "llama-3.1-8b", "--with", "dynamo", cwd=tmp_path)


def test_with_dynamo_is_refused_for_an_embedding_model(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "all-minilm-l6-v2", "--with", "dynamo"],
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path,
                            check=False)
    assert result.returncode == 2 and "--with dynamo serves language models" in result.stderr
    assert "Traceback" not in result.stderr



def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", *args], env={"HF_HUB_OFFLINE": "1"})


def test_model_impl_generic_takes_a_fast_lane_family_through_the_generic_export() -> None:
    """--model-impl generic is in the profile's engine options, so in the plan's digest (and the engine cache's
    key), and the plan says which path the model takes and why; asking for the path auto takes changes nothing."""
    generic = _cli("llama-3.1-8b", "--gpu", "cpu", "--model-impl", "generic")
    auto = _cli("llama-3.1-8b", "--gpu", "cpu")
    assert "path       generic: traced from transformers' own 'llama' modeling code, as --model-impl generic asks" \
        in generic.output and "path       fast lane: mbuild's hand-written graph for 'llama'" in auto.output
    assert _cli("llama-3.1-8b", "--gpu", "cpu", "--model-impl", "fast-lane").output == auto.output
    data = json.loads(_cli("llama-3.1-8b", "--gpu", "cpu", "--model-impl", "generic", "--json").output)
    assert data["profile"]["content"]["engine_options"]["model_impl"] == "generic"
    assert data["digest"] != json.loads(_cli("llama-3.1-8b", "--gpu", "cpu", "--json").output)["digest"]


@pytest.mark.parametrize(("args", "said"), [
    (["llama-3.1-8b", "--gpu", "h100", "--model-impl", "generic"], "TensorRT engines are built from the fast lane"),
    (["all-minilm-l6-v2", "--model-impl", "generic"], "--model-impl chooses a language model's export"),
    (["llama-3.1-8b", "--model-impl", "traced"], "Invalid value for '--model-impl'"),
])
def test_model_impl_is_refused_where_it_cannot_apply(args: list[str], said: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output


def test_the_fast_lane_asked_of_a_type_it_has_no_graph_for_is_refused_by_name(tmp_path: Path) -> None:
    from tests.support.tiny_models import make_tiny_llama

    model = make_tiny_llama(tmp_path / "cohere", train_steps=0, family="cohere")
    result = _cli(str(model), "--gpu", "cpu", "--model-impl", "fast-lane")
    assert result.exit_code == 7 and "language models of type 'cohere' are not supported" in result.output
    assert "path       generic: traced from transformers' own 'cohere'" in _cli(str(model), "--gpu", "cpu").output
