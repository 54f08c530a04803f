"""The build host's settings: the only reader of the environment in builder/ (runtimes/settings.py is the image's).

Parsed by runtimes/envparse.py, the parser the image uses too, so `0`/`off` and numbers mean the same on both
sides. Read at call time, not import time, so variables a test or a wrapper sets apply; the CLI reads them once
at start, so a bad value stops it before any work with one line and exit 2. Every variable is declared once below,
and docs/settings.md's table is written from the declarations (builder/settings_doc.py). Variables huggingface_hub
reads itself (HF_TOKEN, ...) pass through; the HF_* ones here are those mbuild reads too, to find the cache and the
endpoint as the library does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError
from runtimes.envparse import EnvReader, Var, field_values
from runtimes.settings import child_env as child_env  # a program mbuild runs gets this env and its changes

# In docs/settings.md's order. A folder's default follows the one it lives under, when the environment is read (a
# test or a wrapper may move HOME).
HOST_VARIABLES = (
    Var("debug", "MBUILD_DEBUG", "boolean", False,
        "an internal error raises with its traceback instead of a one-line report (exit 70)"),
    Var("build_check", "MBUILD_BUILD_CHECK", "boolean", True,
        "off builds even when the plan's RAM or disk need exceeds what this host has"),
    Var("profile", "MBUILD_PROFILE", "text", None, "the profile to build, as `--profile` (the option wins)"),
    Var("profiles_dir", "MBUILD_PROFILES_DIR", "path", None,
        "a folder of more profile YAML files, beside the built-in ones"),
    Var("cache_dir", "MBUILD_CACHE", "path", None,
        "mbuild's own cache: wheels, installed runtime packages, base images, layers",
        derive=lambda value: value("XDG_CACHE_HOME") / "mbuild",
        default_doc="`$XDG_CACHE_HOME/mbuild`, else `~/.cache/mbuild`"),
    Var("engine_cache", "MBUILD_ENGINE_CACHE", "path", None,
        "validated engines, by engine key, reused by later builds",
        derive=lambda value: value("MBUILD_CACHE") / "engines", default_doc="`$MBUILD_CACHE/engines`"),
    Var(None, "XDG_CACHE_HOME", "path", None,
        "where the two caches above and the Hugging Face cache live by default",
        derive=lambda _: Path.home() / ".cache", default_doc="`~/.cache`"),
    Var("source_date_epoch", "SOURCE_DATE_EPOCH", "integer", 0,
        "the time written into images, so no clock makes two builds differ", low=0, high=2**40, unit="seconds",
        default_doc="{} (1970-01-01, as ko and Bazel)"),
    Var("storage_driver", "MBUILD_CONTAINERS_STORAGE_DRIVER", "text", None,
        "podman's and buildah's `--storage-driver` (`vfs` where overlay is unavailable)",
        default_doc="{} (the host's)"),
    Var("registry_username", "MBUILD_REGISTRY_USERNAME", "text", None,
        "registry user for push and pull (with the password); else `auths` in the Docker config"),
    Var("registry_password", "MBUILD_REGISTRY_PASSWORD", "text", None, "its password or token"),
    Var("insecure_registries", "MBUILD_INSECURE_REGISTRIES", "words", frozenset(),
        "registries reached over plain HTTP (local ones always are)", unit="hosts"),
    Var("registry_auth_hosts", "MBUILD_REGISTRY_AUTH_HOSTS", "words", frozenset(),
        "token hosts trusted with a registry's credentials besides the registry's own (exit 15 otherwise)",
        unit="hosts"),
    Var("docker_config", "DOCKER_CONFIG", "path", None,
        "the folder of `config.json`, whose `auths` give registry credentials",
        derive=lambda _: Path.home() / ".docker", default_doc="`~/.docker`"),
    Var("debian_mirror", "MBUILD_DEBIAN_MIRROR", "text", None, "the default of `mbuild base --mirror`",
        default_doc="`http://deb.debian.org/debian`"),
    Var(None, "HF_HOME", "path", None,
        "Hugging Face's home; mbuild finds the hub cache under it, as huggingface_hub does",
        derive=lambda value: value("XDG_CACHE_HOME") / "huggingface", default_doc="`$XDG_CACHE_HOME/huggingface`"),
    Var("hub_cache", "HF_HUB_CACHE", "path", None, "the Hugging Face cache mbuild reads pinned files from",
        derive=lambda value: value("HF_HOME") / "hub", default_doc="`$HF_HOME/hub`"),
    Var("hub_endpoint", "HF_ENDPOINT", "url", "https://huggingface.co",
        "the Hub (or a mirror) models are resolved and pulled from"),
    Var("hub_offline", "HF_HUB_OFFLINE", "boolean", False,
        "resolve and pull from the local cache only, as `--offline`"),
    Var("cxx", "CXX", "text", None,
        "the C++ compiler that builds mbuild's kernels (`builder/engine/native_kernels.py`)",
        default_doc="{} (`g++`, else `c++`, on the `PATH`)"),
)


@dataclass(frozen=True)
class HostSettings:
    """One field per declared variable that fills one (tests/unit/tree/test_env_reads.py holds the two to each
    other)."""

    debug: bool
    build_check: bool
    profile: str | None
    profiles_dir: Path | None
    cache_dir: Path
    engine_cache: Path
    source_date_epoch: int
    storage_driver: str | None
    registry_username: str | None
    registry_password: str | None
    insecure_registries: frozenset[str]
    registry_auth_hosts: frozenset[str]
    docker_config: Path
    debian_mirror: str | None
    hub_cache: Path
    hub_endpoint: str
    hub_offline: bool
    cxx: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HostSettings:
        env = EnvReader(os.environ if environ is None else environ, error=InputError)
        return cls(**field_values(HOST_VARIABLES, env.read_all(HOST_VARIABLES)))


def host_settings() -> HostSettings:
    """The settings as the environment holds them now; a bad value is an InputError that names it."""
    return HostSettings.from_env()
