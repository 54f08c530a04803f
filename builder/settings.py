"""The build host's settings: the only reader of the environment in builder/ (runtimes/settings.py is the image's).

Parsed by runtimes/envparse.py, the parser the image uses too, so `0`/`off` and numbers mean the same on both
sides. Read at call time, not import time, so variables a test or a wrapper sets apply; the CLI reads them once
at start, so a bad value stops it before any work with one line and exit 2. docs/settings.md lists every
variable (a test holds it to this module). Variables huggingface_hub reads itself (HF_TOKEN, ...) pass through;
the HF_* ones here are those mbuild reads too, to find the cache and the endpoint as the library does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError
from runtimes.envparse import EnvReader
from runtimes.settings import child_env as child_env  # a program mbuild runs gets this env and its changes


@dataclass(frozen=True)
class HostSettings:
    debug: bool  # an internal error raises with its traceback instead of a one-line report
    build_check: bool  # refuse a build this host's RAM or disk cannot hold
    profile: str | None  # the default of --profile
    profiles_dir: Path | None  # more profiles beside the built-in ones
    cache_dir: Path  # wheels, site packages, base images, layers
    engine_cache: Path  # validated engines, by engine key
    source_date_epoch: int  # image timestamps
    storage_driver: str | None  # podman's and buildah's --storage-driver
    registry_username: str | None
    registry_password: str | None
    insecure_registries: frozenset[str]  # hosts (or host:port) reached over plain HTTP
    registry_auth_hosts: frozenset[str]  # token realms trusted with a registry's credentials
    docker_config: Path  # the folder of config.json, whose auths docker writes
    debian_mirror: str | None  # the default of `mbuild base --mirror`
    hub_cache: Path  # the Hugging Face cache, where huggingface_hub looks for it
    hub_endpoint: str
    hub_offline: bool
    cxx: str | None  # the C++ compiler that builds mbuild's kernels (builder/engine/native_kernels.py)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HostSettings:
        env = EnvReader(os.environ if environ is None else environ, error=InputError)
        cache = env.path("XDG_CACHE_HOME") or Path.home() / ".cache"
        mbuild_cache = env.path("MBUILD_CACHE") or cache / "mbuild"
        hf_home = env.path("HF_HOME") or cache / "huggingface"
        return cls(
            debug=env.boolean("MBUILD_DEBUG") or False,
            build_check=env.boolean("MBUILD_BUILD_CHECK") is not False,
            profile=env.text("MBUILD_PROFILE"),
            profiles_dir=env.path("MBUILD_PROFILES_DIR"),
            cache_dir=mbuild_cache,
            engine_cache=env.path("MBUILD_ENGINE_CACHE") or mbuild_cache / "engines",
            # No date makes two builds differ: 0 (1970-01-01), as ko and Bazel do.
            source_date_epoch=env.integer("SOURCE_DATE_EPOCH", 0, 2**40) or 0,
            storage_driver=env.text("MBUILD_CONTAINERS_STORAGE_DRIVER"),
            registry_username=env.text("MBUILD_REGISTRY_USERNAME"),
            registry_password=env.text("MBUILD_REGISTRY_PASSWORD"),
            insecure_registries=env.words("MBUILD_INSECURE_REGISTRIES"),
            registry_auth_hosts=env.words("MBUILD_REGISTRY_AUTH_HOSTS"),
            docker_config=env.path("DOCKER_CONFIG") or Path.home() / ".docker",
            debian_mirror=env.text("MBUILD_DEBIAN_MIRROR"),
            hub_cache=env.path("HF_HUB_CACHE") or hf_home / "hub",
            hub_endpoint=(env.text("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
            hub_offline=env.boolean("HF_HUB_OFFLINE") or False,
            cxx=env.text("CXX"),
        )


def host_settings() -> HostSettings:
    """The settings as the environment holds them now; a bad value is an InputError that names it."""
    return HostSettings.from_env()
