"""The runtime's environment: NIM's container variables mean what the MBUILD_ ones do, an MBUILD_ one set beside
wins, and a malformed value is an error that names the variable the user wrote."""

from __future__ import annotations

import pytest

from runtimes.settings import Settings, SettingsError


def test_nim_names_are_honoured() -> None:
    settings = Settings.from_env({"NIM_SERVED_MODEL_NAME": "meta/llama3-8b-instruct", "NIM_SERVER_PORT": "8123",
                                  "NIM_LOG_LEVEL": "DEBUG", "NIM_MAX_NUM_SEQS": "12", "NIM_JSONL_LOGGING": "1"})
    assert (settings.served_name, settings.port, settings.log_level, settings.max_batch, settings.log_format) == (
        "meta/llama3-8b-instruct", 8123, "debug", 12, "json")


def test_an_mbuild_name_set_beside_wins() -> None:
    settings = Settings.from_env({"NIM_SERVER_PORT": "8123", "MBUILD_PORT": "9000"})
    assert settings.port == 9000


def test_a_bad_nim_value_names_the_nim_variable() -> None:
    with pytest.raises(SettingsError, match=r"NIM_SERVER_PORT \(read as MBUILD_PORT\)='eighty' is not an integer"):
        Settings.from_env({"NIM_SERVER_PORT": "eighty"})
