"""Service settings: the only reader of the environment in runtimes/ (MBUILD_*, NIM_*), read once at start.

Every setting is a field below with its one default; from_env supplies only what the environment sets, parsed by
runtimes/envparse.py; the few booleans read where no Settings reaches (an engine's session) go through flag().
docs/settings.md lists every variable (a test holds it to this module).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes.envparse import EnvReader

PORT = 8000  # the container's port: the image exposes it, manifests and `mbuild serve` default to it
DRAIN_SECONDS = 5  # after SIGTERM: readiness 503 while load balancers stop sending, then the server's SIGTERM
GRACE_SECONDS = 20  # the server's SIGTERM to SIGKILL: in-flight requests finish
PREFILL_CHUNK = 512  # prompt tokens per engine step, so running streams keep decoding
MODEL_DIR = Path("/opt/mbuild/model")  # where the image carries the engine; MBUILD_MODEL_DIR moves it elsewhere
TOOL_PARSERS = ("llama3_json", "hermes", "mistral", "phi4_mini", "granite")  # runtimes/generation/tools.py reads each
HARMONY_VOCABULARY = "TIKTOKEN_ENCODINGS_BASE"  # openai-harmony's own: the folder it loads o200k_base.tiktoken from
LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "critical")


class SettingsError(ValueError):
    pass


# NIM's container variables, honoured as the MBUILD_ ones they mean (an MBUILD_ one set beside wins; both are
# checked), so a deployment written for a NIM container runs an mbuild image unchanged. NIM_JSONL_LOGGING, a
# boolean, is read in from_env.
NIM_ALIASES = {"MBUILD_SERVED_MODEL_NAME": "NIM_SERVED_MODEL_NAME", "MBUILD_PORT": "NIM_SERVER_PORT",
               "MBUILD_LOG_LEVEL": "NIM_LOG_LEVEL", "MBUILD_MAX_BATCH": "NIM_MAX_NUM_SEQS",
               "MBUILD_MODEL_PROFILE": "NIM_MODEL_PROFILE", "MBUILD_TOOL_CALL_PARSER": "NIM_TOOL_CALL_PARSER"}

_INTEGERS = (  # field, variable, lowest, highest
    ("port", "MBUILD_PORT", 1, 65535), ("threads", "MBUILD_THREADS", 0, 1024),
    ("max_queue", "MBUILD_MAX_QUEUE", 1, 1_000_000), ("drain_seconds", "MBUILD_DRAIN_SECONDS", 0, 3600),
    ("grace_seconds", "MBUILD_GRACE_SECONDS", 3, 3600), ("max_body_bytes", "MBUILD_MAX_BODY_BYTES", 1024, 1 << 30),
    ("request_timeout", "MBUILD_REQUEST_TIMEOUT", 1, 86400), ("stream_timeout", "MBUILD_STREAM_TIMEOUT", 1, 86400),
    ("body_timeout", "MBUILD_BODY_TIMEOUT", 1, 3600), ("max_concurrent", "MBUILD_MAX_CONCURRENT", 1, 1_000_000),
    ("prefill_chunk", "MBUILD_PREFILL_CHUNK", 16, 1 << 20), ("prefix_cache_mb", "MBUILD_PREFIX_CACHE_MB", 0, 1 << 24),
    ("kv_cache_mb", "MBUILD_KV_CACHE_MB", 0, 1 << 24),
    ("keepalive_seconds", "MBUILD_KEEPALIVE_SECONDS", 1, 3600),
    ("num_speculative_tokens", "MBUILD_NUM_SPECULATIVE_TOKENS", 1, 16),
    ("prompt_lookup_min", "MBUILD_PROMPT_LOOKUP_MIN", 1, 32), ("prompt_lookup_max", "MBUILD_PROMPT_LOOKUP_MAX", 1, 32),
    ("dynamo_system_port", "DYN_SYSTEM_PORT", 1, 32767),  # Dynamo 1.6.1 reads it as a signed 16-bit number
    ("dynamo_http_port", "DYN_HTTP_PORT", 1, 65535))
_BOOLEANS = (
    ("protect_metrics", "MBUILD_PROTECT_METRICS"), ("access_log", "MBUILD_ACCESS_LOG"), ("tracing", "MBUILD_TRACING"),
    ("skip_hardware_check", "MBUILD_SKIP_HARDWARE_CHECK"), ("allow_unauthenticated", "MBUILD_ALLOW_UNAUTHENTICATED"))
# Read by flag() where an engine's session opens, which no Settings reaches; from_env still checks their values, so a
# malformed one stops the start as any other does.
FLAGS = ("MBUILD_NO_AMX", "MBUILD_TRT_BUILD_AT_START")
_TEXTS = (("host", "MBUILD_HOST"), ("served_name", "MBUILD_SERVED_MODEL_NAME"), ("site", "MBUILD_SITE"),
          ("ssl_certfile", "MBUILD_SSL_CERTFILE"), ("ssl_keyfile", "MBUILD_SSL_KEYFILE"),
          ("model_profile", "MBUILD_MODEL_PROFILE"), ("dynamo_http_host", "DYN_HTTP_HOST"))
_PATHS = (("model_dir", "MBUILD_MODEL_DIR"), ("drain_flag", "MBUILD_DRAIN_FLAG"), ("failed_flag", "MBUILD_FAILED_FLAG"),
          ("harmony_vocabulary", HARMONY_VOCABULARY))
_CHOICES = (("log_level", "MBUILD_LOG_LEVEL", LOG_LEVELS), ("log_format", "MBUILD_LOG_FORMAT", ("text", "json")),
            ("tool_call_parser", "MBUILD_TOOL_CALL_PARSER", ("auto", "none", *TOOL_PARSERS)),
            ("speculative", "MBUILD_SPECULATIVE", ("auto", "off", "ngram", "draft")))


@dataclass(frozen=True)
class Settings:
    model_dir: Path = MODEL_DIR
    host: str = "0.0.0.0"
    port: int = PORT
    api_key: str | None = None  # None: no authentication (see auth_notice)
    log_level: str = "info"
    log_format: str = "text"
    threads: int = 0  # 0: ONNX Runtime picks
    max_queue: int = 256
    served_name: str | None = None
    drain_seconds: float = DRAIN_SECONDS
    grace_seconds: float = GRACE_SECONDS
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout: float = 60.0
    stream_timeout: float = 600.0  # a stream's whole life; a non-stream call has request_timeout
    body_timeout: float = 30.0  # for the body to arrive once the headers have
    max_concurrent: int = 1024  # requests in the process at once; beyond, 503 before any work
    max_batch: int | None = None  # None: the profile's
    max_batch_delay_ms: float | None = None
    prefill_chunk: int = PREFILL_CHUNK
    prefix_cache_mb: int = 1024  # host memory for cached prompt prefixes (0: off)
    kv_cache_mb: int = 0  # the KV pool (slots' caches and prefix entries); 0: the plan's (engine.json's batching)
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
    model_profile: str | None = None  # the profile to serve, by name or id (prefix): must be one the image carries
    tool_call_parser: str = "auto"  # the tool-call format; auto: the one the chat template renders
    allow_unauthenticated: bool = False  # serve without a key on purpose (an empty key is refused otherwise)
    harmony_vocabulary: Path | None = None  # gpt-oss: o200k_base.tiktoken's folder; None: from tokenizer.json
    # speculative decoding: off, ngram (prompt lookup), draft (the bundle's draft model), or auto: draft when the
    # bundle carries one, else off; a request may turn it off
    speculative: str = "auto"
    # the most drafts a verify row carries (vLLM's name), fewer as acceptance falls; None: the method's own
    # (speculative.DEFAULT_DRAFTS)
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int = 2  # the shortest suffix n-gram lookup matches (vLLM's name)
    prompt_lookup_max: int = 4  # and the longest it tries first
    # Dynamo's own variable: the port of a Dynamo worker's status server (/health, /live), which the image's
    # HEALTHCHECK then asks instead of the HTTP server's, since a worker (`python3 -m runtimes.dynamo`) runs none.
    dynamo_system_port: int | None = None
    # Dynamo's own variables for its frontend's address (its --http-host/--http-port win): where the image's frontend
    # puts its key gate when MBUILD_API_KEY is set (runtimes/dynamo/frontend.py), Dynamo itself then on loopback
    dynamo_http_host: str | None = None
    dynamo_http_port: int | None = None

    @property
    def in_flight_seconds(self) -> float:
        """How long the server lets in-flight requests finish once told to stop: the supervisor's grace
        period (it sends SIGKILL after it) less a margin, so the kill never cuts a finishing request short."""
        return max(1.0, self.grace_seconds - 2.0)

    @property
    def auth_notice(self) -> str | None:
        """The line to log at start when the endpoint is open; None when a key guards it."""
        if self.api_key is not None:
            return None
        if self.allow_unauthenticated:
            return "serving without authentication, as MBUILD_ALLOW_UNAUTHENTICATED asks"
        return ("WARNING, the endpoint is unauthenticated: anyone who reaches it can use it; set MBUILD_API_KEY, "
                "or MBUILD_ALLOW_UNAUTHENTICATED=1 to say an open endpoint is meant")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = EnvReader(os.environ if environ is None else environ, NIM_ALIASES, SettingsError)
        values: dict[str, Any] = {name: env.integer(variable, low, high) for name, variable, low, high in _INTEGERS}
        values |= {name: env.boolean(variable) for name, variable in _BOOLEANS}
        values |= {name: env.text(variable) for name, variable in _TEXTS}
        values |= {name: env.path(variable) for name, variable in _PATHS}
        values |= {name: env.choice(variable, choices) for name, variable, choices in _CHOICES}
        for variable in FLAGS:
            env.boolean(variable)
        nim_json = env.boolean("NIM_JSONL_LOGGING")  # NIM's is a boolean: JSON lines or not
        if values["log_format"] is None and nim_json is not None:
            values["log_format"] = "json" if nim_json else "text"
        values["max_batch"] = env.integer("MBUILD_MAX_BATCH", 0, 4096) or None  # 0: the profile's
        delay = env.integer("MBUILD_MAX_BATCH_DELAY_MS", -1, 10000)
        values["max_batch_delay_ms"] = float(delay) if delay is not None and delay >= 0 else None
        values["api_key"] = _api_key(env, bool(values["allow_unauthenticated"]))
        settings = cls(**{name: value for name, value in values.items() if value is not None})
        if settings.prompt_lookup_min > settings.prompt_lookup_max:
            raise SettingsError(f"MBUILD_PROMPT_LOOKUP_MIN ({settings.prompt_lookup_min}) is above "
                                f"MBUILD_PROMPT_LOOKUP_MAX ({settings.prompt_lookup_max}): set the minimum at most the "
                                "maximum")
        return settings


def _api_key(env: EnvReader, allow_open: bool) -> str | None:
    """The key, stripped (no header can carry the newline a key file ends with); set but blank is refused: an
    empty Kubernetes Secret key would otherwise deploy an open endpoint."""
    raw = env.raw("MBUILD_API_KEY")
    if raw is not None and not raw.strip() and not allow_open:
        raise SettingsError("MBUILD_API_KEY is set but empty, which would serve without authentication: set a key, "
                            "unset the variable, or set MBUILD_ALLOW_UNAUTHENTICATED=1 to serve openly")
    return raw.strip() if raw and raw.strip() else None


def flag(name: str) -> bool:
    """One boolean variable, for code that runs before (or without) a Settings, such as engine sessions."""
    return EnvReader(os.environ, error=SettingsError).boolean(name) or False


def export_harmony_vocabulary(folder: Path) -> None:
    """Point openai-harmony at its vocabulary's folder: it reads TIKTOKEN_ENCODINGS_BASE itself, when it loads
    (without it, it would download the file)."""
    os.environ[HARMONY_VOCABULARY] = str(folder)


def export_default(name: str, value: str) -> None:
    """Set another program's variable (Dynamo's, for its frontend run in this process) unless the operator did."""
    os.environ.setdefault(name, value)


def child_env(**changes: str) -> dict[str, str]:
    """This process's environment with `changes`, for a child process (the server the supervisor starts)."""
    return {**os.environ, **changes}
