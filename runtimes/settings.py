"""Service settings: the only reader of the environment in runtimes/ (MBUILD_*, NIM_*), read once at start.

Every variable is declared once below (IMAGE_VARIABLES: its field, kind, bounds, default and docs/settings.md's row,
which builder/settings_doc.py writes from it); from_env reads them all with runtimes/envparse.py, and the few booleans
read where no Settings reaches (an engine's session) go through flag().
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtimes.envparse import EnvReader, Var, field_values

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


# In docs/settings.md's order. A NIM alias is one of NIM's container variables, honoured as the MBUILD_ one it means
# (an MBUILD_ one set beside wins; both are checked), so a deployment written for a NIM container runs an mbuild image
# unchanged. Those without a field are read by the code beside: from_env, or flag() where an engine's session opens
# (from_env still checks their values, so a malformed one stops the start as any other does).
IMAGE_VARIABLES = (
    Var("model_dir", "MBUILD_MODEL_DIR", "path", MODEL_DIR,
        "the model bundle: engine, tokenizer, engine.json, metadata.json",
        default_doc="{} (the image sets it; `mbuild serve` points it at the build)"),
    Var("host", "MBUILD_HOST", "text", "0.0.0.0", "address to listen on (`--host` overrides)"),
    Var("port", "MBUILD_PORT", "integer", PORT, "port to listen on (`--port` overrides); the image exposes 8000",
        low=1, high=65535, alias="NIM_SERVER_PORT"),
    Var("api_key", "MBUILD_API_KEY", "text", None,  # None: no authentication (see auth_notice)
        "bearer key every route but the health probes (and metrics) needs: `Authorization: Bearer <key>`, else 401; "
        "compared in constant time, never logged, surrounding blanks stripped. Unset: the endpoint is open and the "
        "start logs a warning saying so. Set but empty or blank: refused (exit 3), since an empty Kubernetes Secret "
        "key would otherwise deploy an open endpoint"),
    Var("allow_unauthenticated", "MBUILD_ALLOW_UNAUTHENTICATED", "boolean", False,
        "serve without a key on purpose: an empty `MBUILD_API_KEY` is then accepted as none, and the start logs that "
        "the endpoint is open by choice. A key that is set still applies"),
    Var("protect_metrics", "MBUILD_PROTECT_METRICS", "boolean", False,
        "the key guards `/v1/metrics` too; health probes stay open"),
    Var("ssl_certfile", "MBUILD_SSL_CERTFILE", "text", None,
        "serve HTTPS with this certificate; needs `MBUILD_SSL_KEYFILE` (a missing or unreadable file stops the "
        "start, exit 3)", type_doc="path"),
    Var("ssl_keyfile", "MBUILD_SSL_KEYFILE", "text", None, "the certificate's private key", type_doc="path"),
    Var("served_name", "MBUILD_SERVED_MODEL_NAME", "text", None, "the model name requests use and `/v1/models` lists",
        alias="NIM_SERVED_MODEL_NAME", default_doc="the model's repo"),
    Var("model_profile", "MBUILD_MODEL_PROFILE", "text", None,
        "the profile to serve, by name, id or an id prefix of 12+ characters; one the image does not carry stops the "
        "start (exit 3)", alias="NIM_MODEL_PROFILE"),
    Var("log_level", "MBUILD_LOG_LEVEL", "choice", "info", "log level", choices=LOG_LEVELS, alias="NIM_LOG_LEVEL"),
    Var("log_format", "MBUILD_LOG_FORMAT", "choice", "text", "`json`: one JSON object per line",
        choices=("text", "json")),
    Var(None, "NIM_JSONL_LOGGING", "boolean", None,  # NIM's is a boolean: JSON lines or not
        "NIM's switch: on is `MBUILD_LOG_FORMAT=json`, off is `text`"),
    Var("access_log", "MBUILD_ACCESS_LOG", "boolean", True, "one access line per request with its id, never its body"),
    Var("tracing", "MBUILD_TRACING", "boolean", False,
        "serve through BentoML's server for its OpenTelemetry spans (configure the exporter with `BENTOML_CONFIG`); "
        "it starts ~2.5 s later than the default server"),
    Var("threads", "MBUILD_THREADS", "integer", 0, "intra-op threads of the engine", low=0, high=1024,
        default_doc="{} (ONNX Runtime picks)"),
    Var(None, "MBUILD_NO_AMX", "boolean", False,
        "keep mbuild's int8 matrix kernel on AVX-512 VNNI where the core also has AMX, which it otherwise takes for 10 "
        "rows or more (prompt chunks, batches); the numbers are the same either way: this rules the tile unit out"),
    Var("max_queue", "MBUILD_MAX_QUEUE", "integer", 256,
        "requests (or sequences) waiting for the engine; beyond, 429 with `Retry-After`", low=1, high=1_000_000),
    Var("max_concurrent", "MBUILD_MAX_CONCURRENT", "integer", 1024,
        "requests inside the process at once; beyond, 503 with `Retry-After` (health probes exempt)",
        low=1, high=1_000_000),
    Var("max_body_bytes", "MBUILD_MAX_BODY_BYTES", "integer", 4 * 1024 * 1024, "larger bodies get 413",
        low=1024, high=1 << 30, default_doc="{} (4 MiB)"),
    Var("body_timeout", "MBUILD_BODY_TIMEOUT", "integer", 30.0,
        "a body that has not arrived by then, once the headers have, gets 408", low=1, high=3600, unit="seconds"),
    Var("request_timeout", "MBUILD_REQUEST_TIMEOUT", "integer", 60.0,
        "a non-stream request still unanswered is stopped: 503 if it never reached the engine, 504 if it was running",
        low=1, high=86400, unit="seconds"),
    Var("stream_timeout", "MBUILD_STREAM_TIMEOUT", "integer", 600.0,
        "a stream's whole life; then an SSE error event and the end of the stream", low=1, high=86400, unit="seconds"),
    Var("keepalive_seconds", "MBUILD_KEEPALIVE_SECONDS", "integer", 75,
        "idle keep-alive, above the 60 s idle timeout of common load balancers", low=1, high=3600, unit="seconds"),
    Var("max_batch", "MBUILD_MAX_BATCH", "integer", None,  # None (set as 0): the profile's
        "embedding and tensor batches; a language model's slots (running sequences)", low=0, high=4096,
        alias="NIM_MAX_NUM_SEQS", default_doc="0 (the profile's `max_batch`)"),
    Var("max_batch_delay_ms", "MBUILD_MAX_BATCH_DELAY_MS", "integer", None,  # None (set as -1): the profile's
        "how long dynamic batching waits to fill a batch", low=-1, high=10000, default_doc="-1 (the profile's)"),
    Var("prefill_chunk", "MBUILD_PREFILL_CHUNK", "integer", PREFILL_CHUNK,
        "tokens per engine step: every running stream's decode or verify tokens first, prompt chunks in the rest "
        "(never less than a quarter), so running streams keep decoding", low=16, high=1 << 20),
    Var("speculative", "MBUILD_SPECULATIVE", "choice", "auto",
        "speculative decoding: ngram drafts from the sequence's own earlier tokens (prompt lookup), draft from the "
        "image's draft model (`mbuild package --draft`), verified in one step; auto is draft in an image built with "
        "one, else off; used for a row only while its measured acceptance makes the step cheaper per token; a "
        "request's `\"speculative\": false` turns it off for that request", choices=("auto", "off", "ngram", "draft")),
    Var("num_speculative_tokens", "MBUILD_NUM_SPECULATIVE_TOKENS", "integer", None,  # None: speculative.DEFAULT_DRAFTS
        "the most drafts a verify row carries; fewer as acceptance falls (vLLM's `num_speculative_tokens`)",
        low=1, high=16, default_doc="8 for `ngram`, 4 for `draft`"),
    Var("prompt_lookup_min", "MBUILD_PROMPT_LOOKUP_MIN", "integer", 2,
        "the shortest suffix n-gram lookup matches (vLLM's `prompt_lookup_min`)", low=1, high=32,
        type_doc="{}, at most `MBUILD_PROMPT_LOOKUP_MAX`"),  # from_env checks it
    Var("prompt_lookup_max", "MBUILD_PROMPT_LOOKUP_MAX", "integer", 4,
        "the longest suffix it tries first (vLLM's `prompt_lookup_max`)", low=1, high=32),
    Var("dynamo_system_port", "DYN_SYSTEM_PORT", "integer", None,
        "Dynamo's own: a worker's (`python3 -m runtimes.dynamo`) status server port (`/health`, `/live`); when set, "
        "the image's HEALTHCHECK asks its `/health` instead of the HTTP server's readiness", low=1, high=32767,
        type_doc="{} (Dynamo reads it as a signed 16-bit number)"),
    Var("dynamo_http_host", "DYN_HTTP_HOST", "text", None,
        "Dynamo's own: where its frontend (`python3 -m runtimes.dynamo.frontend`) listens, below its `--http-host`; "
        "with `MBUILD_API_KEY` set the image's key gate takes that address and Dynamo's frontend a loopback one",
        type_doc="address", default_doc="`0.0.0.0`"),
    Var("dynamo_http_port", "DYN_HTTP_PORT", "integer", None,
        "Dynamo's own: its frontend's port, below its `--http-port`; with `MBUILD_API_KEY` set, the key gate's",
        low=1, high=65535, default_doc="`8000`"),
    Var("kv_cache_mb", "MBUILD_KV_CACHE_MB", "integer", 0,
        "the KV pool: the most memory the slots' keys and values and the prefix cache's entries hold together, in "
        "blocks of 16 tokens (more than every slot's context gives the prefix cache room of its own, up to "
        "`MBUILD_PREFIX_CACHE_MB`); pages are committed as positions are written, a prompt waits in the queue until "
        "the pool holds it, and a sequence that outgrows it takes the youngest one's blocks (recomputed later)",
        low=0, high=1 << 24, default_doc="{} (the plan's pool, engine.json's `batching.kv_cache_bytes`: every "
        "slot's whole context at the cache's planned bytes)"),
    Var("prefix_cache_mb", "MBUILD_PREFIX_CACHE_MB", "integer", 1024,
        "the most host memory cached prompt prefixes hold, within the KV pool; 0 turns it off", low=0, high=1 << 24),
    Var("tool_call_parser", "MBUILD_TOOL_CALL_PARSER", "choice", "auto",
        "how tool calls are read from a language model's output", choices=("auto", "none", *TOOL_PARSERS),
        alias="NIM_TOOL_CALL_PARSER", default_doc="{} (the format the chat template renders)"),
    Var("harmony_vocabulary", HARMONY_VOCABULARY, "path", None,
        "gpt-oss only: the folder openai-harmony loads `o200k_base.tiktoken` from (OpenAI's file, checked by its "
        "SHA-256); the runtime sets it for openai-harmony, which would otherwise download the file",
        type_doc="a folder", default_doc="{} (written from the model's tokenizer.json under `/tmp`)"),
    Var("drain_seconds", "MBUILD_DRAIN_SECONDS", "integer", DRAIN_SECONDS,
        "after SIGTERM, readiness answers 503 this long (load balancers stop sending) before the server is told to "
        "stop", low=0, high=3600, unit="seconds"),
    Var("grace_seconds", "MBUILD_GRACE_SECONDS", "integer", GRACE_SECONDS,
        "then in-flight requests get this long (less 2 s) before SIGKILL; give the orchestrator a grace period of at "
        "least drain + grace (the manifests of `mbuild deploy` do)", low=3, high=3600, unit="seconds"),
    Var("skip_hardware_check", "MBUILD_SKIP_HARDWARE_CHECK", "boolean", False,
        "start on a host the profile was not built for (unsupported; exit 4 otherwise)"),
    Var(None, "MBUILD_TRT_BUILD_AT_START", "boolean", False,
        "no TensorRT engine in the image fits this GPU: build one at start instead of refusing (see docs/gpu.md)"),
    Var("site", "MBUILD_SITE", "text", None,
        "the image's own packages, installed for one Python version; the start checks that version",
        type_doc="path", default_doc="`/opt/mbuild/site` (the image sets it)"),
    Var("drain_flag", "MBUILD_DRAIN_FLAG", "path", None,
        "internal: the file the supervisor creates to tell the server to drain",
        default_doc="`/tmp/mbuild-PID/draining`"),
    Var("failed_flag", "MBUILD_FAILED_FLAG", "path", None,
        "internal: the file the server writes when the model cannot load (the supervisor then exits 3)",
        default_doc="beside the drain flag"),
)
NIM_ALIASES = {var.variable: var.alias for var in IMAGE_VARIABLES if var.alias}
_DEFAULT = {var.name: var.default for var in IMAGE_VARIABLES if var.name}


@dataclass(frozen=True)
class Settings:
    """One field per declared variable that fills one (tests/unit/tree/test_env_reads.py holds the two to each other),
    its default the declaration's."""

    model_dir: Path = _DEFAULT["model_dir"]
    host: str = _DEFAULT["host"]
    port: int = _DEFAULT["port"]
    api_key: str | None = _DEFAULT["api_key"]
    log_level: str = _DEFAULT["log_level"]
    log_format: str = _DEFAULT["log_format"]
    threads: int = _DEFAULT["threads"]
    max_queue: int = _DEFAULT["max_queue"]
    served_name: str | None = _DEFAULT["served_name"]
    drain_seconds: float = _DEFAULT["drain_seconds"]
    grace_seconds: float = _DEFAULT["grace_seconds"]
    max_body_bytes: int = _DEFAULT["max_body_bytes"]
    request_timeout: float = _DEFAULT["request_timeout"]
    stream_timeout: float = _DEFAULT["stream_timeout"]
    body_timeout: float = _DEFAULT["body_timeout"]
    max_concurrent: int = _DEFAULT["max_concurrent"]
    max_batch: int | None = _DEFAULT["max_batch"]
    max_batch_delay_ms: float | None = _DEFAULT["max_batch_delay_ms"]
    prefill_chunk: int = _DEFAULT["prefill_chunk"]
    prefix_cache_mb: int = _DEFAULT["prefix_cache_mb"]
    kv_cache_mb: int = _DEFAULT["kv_cache_mb"]
    protect_metrics: bool = _DEFAULT["protect_metrics"]
    access_log: bool = _DEFAULT["access_log"]
    tracing: bool = _DEFAULT["tracing"]
    ssl_certfile: str | None = _DEFAULT["ssl_certfile"]
    ssl_keyfile: str | None = _DEFAULT["ssl_keyfile"]
    keepalive_seconds: int = _DEFAULT["keepalive_seconds"]
    drain_flag: Path | None = _DEFAULT["drain_flag"]
    failed_flag: Path | None = _DEFAULT["failed_flag"]
    site: str | None = _DEFAULT["site"]
    skip_hardware_check: bool = _DEFAULT["skip_hardware_check"]
    model_profile: str | None = _DEFAULT["model_profile"]
    tool_call_parser: str = _DEFAULT["tool_call_parser"]
    allow_unauthenticated: bool = _DEFAULT["allow_unauthenticated"]
    harmony_vocabulary: Path | None = _DEFAULT["harmony_vocabulary"]
    speculative: str = _DEFAULT["speculative"]
    num_speculative_tokens: int | None = _DEFAULT["num_speculative_tokens"]
    prompt_lookup_min: int = _DEFAULT["prompt_lookup_min"]
    prompt_lookup_max: int = _DEFAULT["prompt_lookup_max"]
    dynamo_system_port: int | None = _DEFAULT["dynamo_system_port"]
    dynamo_http_host: str | None = _DEFAULT["dynamo_http_host"]
    dynamo_http_port: int | None = _DEFAULT["dynamo_http_port"]

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
        read = env.read_all(IMAGE_VARIABLES)
        nim_json = read["NIM_JSONL_LOGGING"]
        if read["MBUILD_LOG_FORMAT"] is None and nim_json is not None:
            read["MBUILD_LOG_FORMAT"] = "json" if nim_json else "text"
        values = field_values(IMAGE_VARIABLES, read)
        values["max_batch"] = values["max_batch"] or None  # 0: the profile's
        delay = values["max_batch_delay_ms"]
        values["max_batch_delay_ms"] = float(delay) if delay is not None and delay >= 0 else None  # -1: the profile's
        values["api_key"] = _api_key(env, values["allow_unauthenticated"])
        settings = cls(**values)
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
