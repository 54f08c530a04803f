"""Service settings: the only reader of the environment in runtimes/ (MBUILD_*), read once.

Every limit the service enforces is here with its default and its variable; docs/reliability.md lists them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


TOOL_PARSERS = ("llama3_json", "hermes", "mistral")  # runtimes/generation/tools.py reads each


class SettingsError(ValueError):
    pass


# NIM's container variables, honoured as the MBUILD_ ones they mean (an MBUILD_ one set beside wins), so a
# deployment written for a NIM container runs an mbuild image unchanged.
NIM_ALIASES = {"MBUILD_SERVED_MODEL_NAME": "NIM_SERVED_MODEL_NAME", "MBUILD_PORT": "NIM_SERVER_PORT",
               "MBUILD_LOG_LEVEL": "NIM_LOG_LEVEL", "MBUILD_MAX_BATCH": "NIM_MAX_NUM_SEQS",
               "MBUILD_LOG_FORMAT": "NIM_JSONL_LOGGING", "MBUILD_MODEL_PROFILE": "NIM_MODEL_PROFILE",
               "MBUILD_TOOL_CALL_PARSER": "NIM_TOOL_CALL_PARSER"}


class _Env:
    """Typed reads of one environment mapping; a malformed value is a SettingsError that names it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.alias: dict[str, str] = {}
        for name, nim in NIM_ALIASES.items():
            if not self.env.get(name) and self.env.get(nim):
                value = self.env[nim]
                if nim == "NIM_JSONL_LOGGING":  # a boolean in NIM: JSON lines or not
                    value = "json" if value.strip().lower() in TRUE else "text"
                self.env[name], self.alias[name] = value, nim

    def _named(self, name: str) -> str:
        return f"{self.alias[name]} (read as {name})" if name in self.alias else name

    def text(self, name: str, default: str | None = None) -> str | None:
        return self.env.get(name) or default

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self.env.get(name, "").strip()
        if not raw:
            return default
        if not (raw.isascii() and raw.lstrip("-").isdigit()):
            raise SettingsError(f"{self._named(name)}={raw!r} is not an integer")
        value = int(raw)
        if not low <= value <= high:
            raise SettingsError(f"{self._named(name)}={value} is outside {low}..{high}")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        raw = self.env.get(name)
        if raw is None:
            return default
        if raw.strip().lower() in TRUE:
            return True
        if raw.strip().lower() in FALSE:
            return False
        raise SettingsError(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.env.get(name, default).strip().lower() or default
        if value not in choices:
            raise SettingsError(f"{self._named(name)}={value!r}: use one of {', '.join(choices)}")
        return value


@dataclass(frozen=True)
class Settings:
    model_dir: Path
    host: str
    port: int
    api_key: str | None
    log_level: str
    log_format: str
    threads: int
    max_queue: int
    served_name: str | None
    drain_seconds: float = 5.0
    grace_seconds: float = 20.0
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout: float = 60.0
    stream_timeout: float = 600.0  # a stream's whole life; a non-stream call has request_timeout
    body_timeout: float = 30.0  # for the body to arrive once the headers have
    max_concurrent: int = 1024  # requests in the process at once; beyond, 503 before any work
    max_batch: int | None = None  # None: the profile's
    max_batch_delay_ms: float | None = None
    prefill_chunk: int = 512  # prompt tokens per engine step, so running streams keep decoding
    prefix_cache_mb: int = 1024  # host memory for cached prompt prefixes (0: off)
    protect_metrics: bool = False
    access_log: bool = True
    tracing: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    keepalive_seconds: int = 75  # above the 60 s idle timeout of common load balancers, so they close first
    drain_flag: Path | None = None  # the supervisor creates it to start a drain
    failed_flag: Path | None = None  # the worker writes it when the model cannot load
    site: str | None = None  # the image's own packages folder (tied to one Python version)
    skip_hardware_check: bool = False
    trt_build_at_start: bool = False
    model_profile: str | None = None  # the profile to serve, by name or id (prefix): must be one the image carries
    tool_call_parser: str = "auto"  # the tool-call format; auto: the one the chat template renders

    @property
    def in_flight_seconds(self) -> float:
        """How long the server lets in-flight requests finish once told to stop: the supervisor's grace
        period (it sends SIGKILL after it) less a margin, so the kill never cuts a finishing request short."""
        return max(1.0, self.grace_seconds - 2.0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = _Env(os.environ if environ is None else environ)
        delay = env.integer("MBUILD_MAX_BATCH_DELAY_MS", -1, -1, 10000)
        flags = {name: env.text(variable) for name, variable in (("drain", "MBUILD_DRAIN_FLAG"),
                                                                 ("failed", "MBUILD_FAILED_FLAG"))}
        return cls(
            model_dir=Path(env.text("MBUILD_MODEL_DIR", "/opt/mbuild/model") or "/opt/mbuild/model"),
            host=env.text("MBUILD_HOST", "0.0.0.0") or "0.0.0.0",
            port=env.integer("MBUILD_PORT", 8000, 1, 65535),
            api_key=env.text("MBUILD_API_KEY"),
            log_level=env.choice("MBUILD_LOG_LEVEL", "info", ("debug", "info", "warning", "warn", "error", "critical")),
            log_format=env.choice("MBUILD_LOG_FORMAT", "text", ("text", "json")),
            threads=env.integer("MBUILD_THREADS", 0, 0, 1024),
            max_queue=env.integer("MBUILD_MAX_QUEUE", 256, 1, 1_000_000),
            served_name=env.text("MBUILD_SERVED_MODEL_NAME"),
            drain_seconds=env.integer("MBUILD_DRAIN_SECONDS", 5, 0, 3600),
            grace_seconds=env.integer("MBUILD_GRACE_SECONDS", 20, 3, 3600),
            max_body_bytes=env.integer("MBUILD_MAX_BODY_BYTES", 4 * 1024 * 1024, 1024, 1 << 30),
            request_timeout=env.integer("MBUILD_REQUEST_TIMEOUT", 60, 1, 86400),
            stream_timeout=env.integer("MBUILD_STREAM_TIMEOUT", 600, 1, 86400),
            body_timeout=env.integer("MBUILD_BODY_TIMEOUT", 30, 1, 3600),
            max_concurrent=env.integer("MBUILD_MAX_CONCURRENT", 1024, 1, 1_000_000),
            max_batch=env.integer("MBUILD_MAX_BATCH", 0, 0, 4096) or None,
            prefill_chunk=env.integer("MBUILD_PREFILL_CHUNK", 512, 16, 1 << 20),
            prefix_cache_mb=env.integer("MBUILD_PREFIX_CACHE_MB", 1024, 0, 1 << 24),
            max_batch_delay_ms=float(delay) if delay >= 0 else None,
            protect_metrics=env.boolean("MBUILD_PROTECT_METRICS"),
            access_log=env.boolean("MBUILD_ACCESS_LOG", True),
            tracing=env.boolean("MBUILD_TRACING"),
            ssl_certfile=env.text("MBUILD_SSL_CERTFILE"),
            ssl_keyfile=env.text("MBUILD_SSL_KEYFILE"),
            keepalive_seconds=env.integer("MBUILD_KEEPALIVE_SECONDS", 75, 1, 3600),
            drain_flag=Path(flags["drain"]) if flags["drain"] else None,
            failed_flag=Path(flags["failed"]) if flags["failed"] else None,
            site=env.text("MBUILD_SITE"),
            skip_hardware_check=env.boolean("MBUILD_SKIP_HARDWARE_CHECK"),
            trt_build_at_start=env.boolean("MBUILD_TRT_BUILD_AT_START"),
            model_profile=env.text("MBUILD_MODEL_PROFILE"),
            tool_call_parser=env.choice("MBUILD_TOOL_CALL_PARSER", "auto", ("auto", "none", *TOOL_PARSERS)),
        )


def flag(name: str) -> bool:
    """One boolean variable, for code that runs before (or without) a Settings, such as engine sessions."""
    return _Env(os.environ).boolean(name)
