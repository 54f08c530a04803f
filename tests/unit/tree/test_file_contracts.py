"""The files a build hands the image and the deploy step are typed, versioned contracts: a file of another
format, or with a missing or ill-typed field, is refused with a message that names the file, the field or both
formats, and what to do; never a traceback, never a default silently put in its place."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from builder.cli import cli as mbuild_cli
from builder.model.geometry import head_geometry
from builder.plan_record import PlanRecord
from runtimes.__main__ import preflight
from runtimes.bundle import BundleError, load_engine_config, load_metadata, load_report
from tests.support.bundles import edit_json
from tests.support.deploy_cases import cli, plan_file


@pytest.fixture
def bundle(tiny_build: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny_build / "model", tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.parametrize("name", ["engine.json", "metadata.json", "report.json"])
@pytest.mark.parametrize("found", [0, 2, ...], ids=["older", "newer", "no-format-field"])
def test_the_runtime_refuses_a_bundle_file_of_another_format(bundle: Path, name: str, found: object) -> None:
    edit_json(bundle / name, {"format": found})
    with pytest.raises(BundleError) as caught:
        preflight(bundle)
        load_report(bundle)
    message = str(caught.value)
    assert name in message and "format 1" in message and "rebuild" in message
    assert (f"format {found}" if found is not ... else "no format field") in message


def test_the_image_exits_3_with_the_reason_not_a_traceback(bundle: Path) -> None:
    edit_json(bundle / "engine.json", {"format": 0})
    result = subprocess.run([sys.executable, "-m", "runtimes"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "MBUILD_MODEL_DIR": str(bundle), "MBUILD_PORT": "1"}, check=False)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "engine.json: it is format 0; this mbuild reads format 1" in result.stderr


@pytest.mark.parametrize(("name", "change", "says"), [
    ("engine.json", {"options.embedding_dim": "wide"}, "engine.json: options.embedding_dim must be an integer"),
    ("engine.json", {"batching": ...}, "engine.json: batching is missing"),
    ("engine.json", {"batching.max_batch": 0}, "engine.json: batching.max_batch must lie between 1 and 4096"),
    ("engine.json", {"task": "chat"}, "engine.json: task must be one of"),
    ("engine.json", {"requantized": "no"}, "engine.json: requantized must be true or false"),
    ("engine.json", {"source_format": 4}, "engine.json: source_format must be a string"),
    ("metadata.json", {"requires.memory_gb": -1}, "metadata.json: requires.memory_gb must lie between 0"),
    ("metadata.json", {"profile.id": 7}, "metadata.json: profile.id must be a string (got 7)"),
    ("report.json", {"passed": "yes"}, "report.json: passed must be true or false"),
])
def test_a_missing_or_ill_typed_field_is_named(bundle: Path, name: str, change: dict[str, Any], says: str) -> None:
    edit_json(bundle / name, change)
    with pytest.raises(BundleError, match=re.escape(says)):
        load_engine_config(bundle)
        load_metadata(bundle)
        load_report(bundle)


def test_the_engine_json_a_build_writes_carries_its_plan_s_batching(tiny_build: Path) -> None:
    plan = PlanRecord.parse((tiny_build / "plan.json").read_text())
    config = load_engine_config(tiny_build / "model")
    assert config.batching.max_batch == plan.max_batch
    assert config.options == config.encoder and config.encoder.embedding_dim == 32


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return json.loads(plan_file("minilm-cpu", tmp_path_factory.mktemp("plan")).read_text())


def _deploy(plan: dict[str, Any], folder: Path) -> subprocess.CompletedProcess[str]:
    (folder / "plan.json").write_text(json.dumps(plan))
    return cli("deploy", str(folder / "plan.json"))


@pytest.mark.parametrize("memory", [-5, 1e30, math.nan, "lots"], ids=["negative", "1e30", "nan", "string"])
def test_deploy_refuses_a_plan_whose_memory_is_no_size(saved_plan: dict[str, Any], tmp_path: Path,
                                                       memory: object) -> None:
    """Before: silently the smallest request (1Gi), a manifest asking 1e30Gi, or a traceback."""
    result = _deploy({**saved_plan, "requires": {**saved_plan["requires"], "memory_gb": memory}}, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "requires.memory_gb" in result.stderr and "apiVersion" not in result.stdout


@pytest.mark.parametrize(("field", "value"), [("task", "chat"), ("requires.gpus", "two"), ("tag", None),
                                              ("profile.content.limits.max_batch", 0)])
def test_deploy_refuses_other_ill_typed_plan_fields(saved_plan: dict[str, Any], tmp_path: Path, field: str,
                                                    value: object) -> None:
    plan = json.loads(json.dumps(saved_plan))
    _edit_dict(plan, field, value)
    result = _deploy(plan, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert field in result.stderr and "apiVersion" not in result.stdout


def _edit_dict(data: dict[str, Any], dotted: str, value: object) -> None:
    *parents, name = dotted.split(".")
    for key in parents:
        data = data[key]
    data[name] = value


@pytest.mark.parametrize("found", [0, ...], ids=["older", "no-format-field"])
def test_deploy_refuses_a_plan_of_another_format(saved_plan: dict[str, Any], tmp_path: Path, found: object) -> None:
    plan = {k: v for k, v in saved_plan.items() if k != "format"} if found is ... else {**saved_plan, "format": found}
    result = _deploy(plan, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "this mbuild reads format 1" in result.stderr and "mbuild plan MODEL --json" in result.stderr


def test_a_build_directory_s_image_json_of_another_format_is_refused(tiny_build: Path, tmp_path: Path) -> None:
    build = tmp_path / "build"
    shutil.copytree(tiny_build, build, ignore=shutil.ignore_patterns("site", "oci"))
    (build / "image.json").write_text(json.dumps({"backend": "oci", "tag": "mbuild/x:1"}))
    for args in (["push", str(build), "localhost:5000/x:1"], ["load", str(build)], ["inspect", str(build)]):
        result = CliRunner().invoke(mbuild_cli, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, (args, result.output)
        assert "image.json: an older mbuild wrote it, with no format field; this mbuild reads format 1" in \
            result.output and "package the build directory again" in result.output


def test_a_build_directory_s_report_json_of_another_format_is_refused(tiny_build: Path, tmp_path: Path) -> None:
    build = tmp_path / "build"
    shutil.copytree(tiny_build, build, ignore=shutil.ignore_patterns("site", "oci"))
    edit_json(build / "model" / "report.json", {"format": 0})
    result = CliRunner().invoke(mbuild_cli, ["serve", str(build)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "report.json: it is format 0; this mbuild reads format 1" in result.output and "hint:" in result.output


def test_head_geometry_is_one_derivation_for_dicts_and_configs() -> None:
    from transformers import LlamaConfig

    raw: dict[str, Any] = {"num_attention_heads": 8, "num_hidden_layers": 2, "hidden_size": 256,
                           "num_key_value_heads": 2}
    config = LlamaConfig(num_attention_heads=8, num_hidden_layers=2, hidden_size=256, num_key_value_heads=2)
    assert head_geometry(raw) == head_geometry(config)
    geometry = head_geometry({**raw, "num_key_value_heads": None})
    assert (geometry.layers, geometry.heads, geometry.kv_heads, geometry.head_dim) == (2, 8, 8, 32)
