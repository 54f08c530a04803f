"""Service settings, read once from the environment (MBUILD_*)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class SettingsError(ValueError):
    pass


def _int(name: str, default: int, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an integer") from exc
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} is outside {low}..{high}")
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
    max_batch: int | None = None  # None: the profile's
    max_batch_delay_ms: float | None = None
    protect_metrics: bool = False
    access_log: bool = True
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    keepalive_seconds: int = 75  # above the 60 s idle timeout of common load balancers, so they close first

    @classmethod
    def from_env(cls) -> Settings:
        fmt = os.environ.get("MBUILD_LOG_FORMAT", "text").lower()
        if fmt not in {"text", "json"}:
            raise SettingsError(f"MBUILD_LOG_FORMAT={fmt!r}: use text or json")
        return cls(
            model_dir=Path(os.environ.get("MBUILD_MODEL_DIR", "/opt/mbuild/model")),
            host=os.environ.get("MBUILD_HOST", "0.0.0.0"),
            port=_int("MBUILD_PORT", 8000, 1, 65535),
            api_key=os.environ.get("MBUILD_API_KEY") or None,
            log_level=os.environ.get("MBUILD_LOG_LEVEL", "info").lower(),
            log_format=fmt,
            threads=_int("MBUILD_THREADS", 0, 0, 1024),
            max_queue=_int("MBUILD_MAX_QUEUE", 256, 1, 1_000_000),
            served_name=os.environ.get("MBUILD_SERVED_MODEL_NAME") or None,
            drain_seconds=_int("MBUILD_DRAIN_SECONDS", 5, 0, 3600),
            grace_seconds=_int("MBUILD_GRACE_SECONDS", 20, 1, 3600),
            max_body_bytes=_int("MBUILD_MAX_BODY_BYTES", 4 * 1024 * 1024, 1024, 1 << 30),
            request_timeout=_int("MBUILD_REQUEST_TIMEOUT", 60, 1, 86400),
            max_batch=_int("MBUILD_MAX_BATCH", 0, 0, 4096) or None,
            max_batch_delay_ms=float(_int("MBUILD_MAX_BATCH_DELAY_MS", -1, -1, 10000))
            if os.environ.get("MBUILD_MAX_BATCH_DELAY_MS") else None,
            protect_metrics=os.environ.get("MBUILD_PROTECT_METRICS", "").lower() in {"1", "true", "yes"},
            access_log=os.environ.get("MBUILD_ACCESS_LOG", "1").lower() not in {"0", "false", "no"},
            ssl_certfile=os.environ.get("MBUILD_SSL_CERTFILE") or None,
            ssl_keyfile=os.environ.get("MBUILD_SSL_KEYFILE") or None,
            keepalive_seconds=_int("MBUILD_KEEPALIVE_SECONDS", 75, 1, 3600),
        )
