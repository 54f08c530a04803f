"""Packaging the same model twice with unchanged inputs reuses the first build, and says so."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from builder.cli import cli


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


def test_a_changed_input_rebuilds(tiny_encoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    package(str(tiny_encoder), "--output", str(out))
    again = package(str(tiny_encoder), "--output", str(out), "--version", "2.0.0")
    assert "reused" not in again and "✓ export" in again
