"""The build host's environment: one boolean parser for every variable, a bad value is a one-line error with
an exit code (never a traceback, never a silent default), and MBUILD_DEBUG=0 means off."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import INTERNAL_ERROR, cli
from builder.errors import InputError
from builder.settings import HostSettings
from tests.unit.builder.planning.test_plan import _plan


def _internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug, as the CLI meets one: an exception that is no MbuildError, inside a command."""
    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("boom")
    monkeypatch.setattr(importlib.import_module("builder.cli.plan"), "plan_package", boom)


@pytest.mark.parametrize("off", ["0", "false", "no", "off", "OFF", ""])
def test_mbuild_debug_off_is_off(off: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _internal_error(monkeypatch)
    result = CliRunner().invoke(cli, ["plan", "all-minilm-l6-v2"], env={"MBUILD_DEBUG": off})
    assert result.exit_code == INTERNAL_ERROR, result.output
    assert "internal error: RuntimeError: boom" in result.output and "MBUILD_DEBUG=1" in result.output


@pytest.mark.parametrize("on", ["1", "true", "yes", "on"])
def test_mbuild_debug_on_shows_the_traceback(on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _internal_error(monkeypatch)
    result = CliRunner().invoke(cli, ["plan", "all-minilm-l6-v2"], env={"MBUILD_DEBUG": on})
    assert isinstance(result.exception, RuntimeError)


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("MBUILD_DEBUG", "maybe", "use 1/true/yes/on or 0/false/no/off"),
    ("MBUILD_BUILD_CHECK", "sometimes", "use 1/true/yes/on or 0/false/no/off"),
    ("HF_HUB_OFFLINE", "perhaps", "use 1/true/yes/on or 0/false/no/off"),
    ("SOURCE_DATE_EPOCH", "yesterday", "is not an integer"),
    ("SOURCE_DATE_EPOCH", "-5", "is outside"),
])
def test_a_bad_value_is_one_line_and_exit_2(variable: str, value: str, says: str) -> None:
    result = CliRunner().invoke(cli, ["plan", "all-minilm-l6-v2", "--offline"], env={variable: value})
    assert result.exit_code == InputError.exit_code, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {variable}=") and says in line


@pytest.mark.parametrize("off", ["0", "false", "no", "off"])
def test_the_build_check_is_off_for_every_off_word(off: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.build import host_fit

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(host_fit.shutil, "disk_usage", lambda _: usage._replace(free=1000))
    monkeypatch.setenv("MBUILD_BUILD_CHECK", off)
    host_fit.check_disk(_plan(), tmp_path)  # builds anyway, as MBUILD_BUILD_CHECK=0 always did


def test_a_folder_defaults_under_the_one_it_lives_in(tmp_path: Path) -> None:
    """The caches follow XDG_CACHE_HOME, MBUILD_CACHE and HF_HOME as they are set, each read when the env is."""
    settings = HostSettings.from_env({"XDG_CACHE_HOME": str(tmp_path), "HF_ENDPOINT": "https://mirror.example/"})
    assert (settings.cache_dir, settings.engine_cache, settings.hub_cache) == (
        tmp_path / "mbuild", tmp_path / "mbuild" / "engines", tmp_path / "huggingface" / "hub")
    assert settings.hub_endpoint == "https://mirror.example"
    moved = HostSettings.from_env({"XDG_CACHE_HOME": str(tmp_path), "MBUILD_CACHE": str(tmp_path / "m"),
                                   "HF_HOME": str(tmp_path / "hf")})
    assert (moved.engine_cache, moved.hub_cache) == (tmp_path / "m" / "engines", tmp_path / "hf" / "hub")
