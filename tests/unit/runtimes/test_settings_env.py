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


# An alias's value is checked even when the MBUILD_ name beside it wins: a typo in a NIM variable is an error, not
# a value silently dropped (the image sets MBUILD_PORT itself, so NIM_SERVER_PORT is always "beside" one there).
@pytest.mark.parametrize(("env", "says"), [
    ({"MBUILD_PORT": "99999"}, r"MBUILD_PORT=99999 is outside 1\.\.65535"),
    ({"NIM_SERVER_PORT": "99999"}, r"NIM_SERVER_PORT \(read as MBUILD_PORT\)=99999 is outside 1\.\.65535"),
    ({"NIM_SERVER_PORT": "0"}, r"NIM_SERVER_PORT \(read as MBUILD_PORT\)=0 is outside"),
    ({"MBUILD_PORT": "8000", "NIM_SERVER_PORT": "99999"}, r"NIM_SERVER_PORT \(read as MBUILD_PORT\)=99999"),
    ({"MBUILD_PORT": "8000", "NIM_SERVER_PORT": "eighty"}, r"NIM_SERVER_PORT .*'eighty' is not an integer"),
    ({"MBUILD_MAX_BATCH": "8", "NIM_MAX_NUM_SEQS": "lots"}, r"NIM_MAX_NUM_SEQS .*'lots' is not an integer"),
    ({"MBUILD_LOG_LEVEL": "info", "NIM_LOG_LEVEL": "chatty"}, r"NIM_LOG_LEVEL .*'chatty': use one of"),
    ({"NIM_JSONL_LOGGING": "maybe"}, r"NIM_JSONL_LOGGING='maybe': use 1/true/yes/on or 0/false/no/off"),
    ({"MBUILD_TRT_BUILD_AT_START": "please"}, r"MBUILD_TRT_BUILD_AT_START='please': use 1/true"),  # read by flag()
    # Dynamo's frontend address, where the key gate listens (runtimes/dynamo/frontend.py)
    ({"DYN_HTTP_PORT": "70000"}, r"DYN_HTTP_PORT=70000 is outside 1\.\.65535"),
    ({"DYN_HTTP_PORT": "http"}, r"DYN_HTTP_PORT='http' is not an integer"),
])
def test_a_bad_value_is_refused_under_every_name(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        Settings.from_env(env)


def test_nim_jsonl_logging_off_means_text() -> None:
    assert Settings.from_env({"NIM_JSONL_LOGGING": "0"}).log_format == "text"
    assert Settings.from_env({"NIM_JSONL_LOGGING": "0", "MBUILD_LOG_FORMAT": "json"}).log_format == "json"


@pytest.mark.parametrize("key", ["", "   ", "\n"])
def test_an_empty_api_key_is_refused(key: str) -> None:
    """A Kubernetes Secret whose key is empty must not deploy an open endpoint."""
    with pytest.raises(SettingsError, match="MBUILD_API_KEY is set but empty") as refused:
        Settings.from_env({"MBUILD_API_KEY": key})
    assert "unset" in str(refused.value) and "MBUILD_ALLOW_UNAUTHENTICATED=1" in str(refused.value)


def test_an_open_server_is_an_explicit_choice_and_is_said() -> None:
    chosen = Settings.from_env({"MBUILD_API_KEY": "", "MBUILD_ALLOW_UNAUTHENTICATED": "1"})
    assert chosen.api_key is None
    assert "MBUILD_ALLOW_UNAUTHENTICATED" in (chosen.auth_notice or "")
    unset = Settings.from_env({})  # the documented default: no key, an open server, and a warning at start
    assert unset.api_key is None
    assert "WARNING" in (unset.auth_notice or "") and "unauthenticated" in (unset.auth_notice or "")
    keyed = Settings.from_env({"MBUILD_API_KEY": " s3cret\n", "MBUILD_ALLOW_UNAUTHENTICATED": "1"})
    assert keyed.api_key == "s3cret" and keyed.auth_notice is None  # a key always applies; no header holds "\n"


def test_empty_means_unset() -> None:
    assert Settings.from_env({"MBUILD_PORT": " ", "MBUILD_ACCESS_LOG": ""}) == Settings.from_env({})


def test_the_defaults_are_the_dataclass_defaults() -> None:
    """from_env with nothing set is exactly Settings(): one place holds each default."""
    assert Settings.from_env({}) == Settings()


def test_a_lookup_minimum_above_its_maximum_is_refused_with_what_to_set() -> None:
    with pytest.raises(SettingsError, match=r"MBUILD_PROMPT_LOOKUP_MIN \(5\) is above MBUILD_PROMPT_LOOKUP_MAX \(3\)"
                       ) as refused:
        Settings.from_env({"MBUILD_PROMPT_LOOKUP_MIN": "5", "MBUILD_PROMPT_LOOKUP_MAX": "3"})
    assert "at most" in str(refused.value)
    chosen = Settings.from_env({"MBUILD_PROMPT_LOOKUP_MIN": "3", "MBUILD_PROMPT_LOOKUP_MAX": "3"})
    assert (chosen.prompt_lookup_min, chosen.prompt_lookup_max) == (3, 3)
