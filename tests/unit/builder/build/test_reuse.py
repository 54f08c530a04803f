"""Packaging the same model twice with unchanged inputs reuses the first build, and says so; a change
that cannot alter the engine (version, batching limits) reuses the validated engine from the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.engine.cache import cached, store
from runtimes.bundle import load_engine_config


def package(*args: str) -> str:
    result = CliRunner().invoke(cli, ["package", *args, "--backend", "none"])
    assert result.exit_code == 0, result.output
    return result.output


def test_second_run_reuses_the_build(tiny_encoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    first = package(str(tiny_encoder), "--output", str(out))
    assert "export" in first and "reused" not in first
    engine = out / "model" / "model.onnx"
    stamp = engine.stat().st_mtime_ns

    second = package(str(tiny_encoder), "--output", str(out))
    assert "reused" in second and "plan digest" in second
    for stage in ("✓ download", "✓ export", "✓ compile", "✓ validate"):
        assert stage not in second
    assert engine.stat().st_mtime_ns == stamp  # the engine was not rebuilt


def test_a_new_version_rebuilds_the_context_around_the_cached_engine(tiny_encoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    package(str(tiny_encoder), "--output", str(out))
    engine = (out / "model" / "model.onnx").read_bytes()
    again = package(str(tiny_encoder), "--output", str(out), "--version", "2.0.0")
    assert "plan digest" not in again and "reused the validated engine" in again
    for stage in ("✓ export", "✓ compile", "✓ validate"):
        assert stage not in again
    assert "✓ context" in again and "2.0.0" in (out / "mbuild.lock").read_text()
    assert (out / "model" / "model.onnx").read_bytes() == engine
    assert json.loads((out / "report.json").read_text())["passed"] is True


def test_a_limits_only_change_reuses_the_engine_with_the_new_limits(tiny_encoder: Path, tmp_path: Path) -> None:
    package(str(tiny_encoder), "--output", str(tmp_path / "latency"), "--mode", "latency")
    throughput = package(str(tiny_encoder), "--output", str(tmp_path / "throughput"), "--mode", "throughput")
    assert "reused the validated engine" in throughput and "✓ export" not in throughput
    configs = {mode: load_engine_config(tmp_path / mode / "model") for mode in ("latency", "throughput")}
    assert configs["latency"].batching.max_batch < configs["throughput"].batching.max_batch
    assert configs["latency"].with_batching(configs["throughput"].batching) == configs["throughput"]
    # the cached copy keeps its own limits: the second build wrote a new file, not through a hard link
    package(str(tiny_encoder), "--output", str(tmp_path / "latency-again"), "--mode", "latency", "--version", "3")
    assert load_engine_config(tmp_path / "latency-again" / "model") == configs["latency"]


def test_another_precision_builds_a_new_engine(tiny_encoder: Path, tmp_path: Path) -> None:
    package(str(tiny_encoder), "--output", str(tmp_path / "fp32"), "--precision", "fp32")
    int8 = package(str(tiny_encoder), "--output", str(tmp_path / "int8"), "--precision", "int8")
    assert "reused" not in int8 and "✓ export" in int8 and "✓ validate" in int8


def test_an_unfinished_cache_entry_is_not_used(tiny_build: Path, engine_cache: Path) -> None:
    (engine_cache / "abc").mkdir(parents=True)  # as a build killed while storing leaves it
    assert cached("abc") is None and cached(None) is None
    store("abc", tiny_build / "model")
    assert cached("abc") == engine_cache / "abc"


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tiny_encoder: Path, tmp_path: Path, engine_cache: Path) -> None:
    package(str(tiny_encoder), "--output", str(tmp_path / "first"))
    for entry in engine_cache.glob("*/engine.json"):
        entry.write_text("{not json")
    again = package(str(tiny_encoder), "--output", str(tmp_path / "second"), "--version", "2")
    assert "reused the validated engine" not in again and "✓ export" in again and "✓ validate" in again
    assert load_engine_config(tmp_path / "second" / "model").task == "embedding"


def test_an_unwritable_cache_leaves_the_build_whole(tiny_encoder: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MBUILD_ENGINE_CACHE", str(blocked))
    out = package(str(tiny_encoder), "--output", str(tmp_path / "build"))
    assert "engine not cached" in out and "MBUILD_ENGINE_CACHE" in out
    assert json.loads((tmp_path / "build" / "report.json").read_text())["passed"] is True
