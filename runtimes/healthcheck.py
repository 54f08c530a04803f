"""The image's HEALTHCHECK: exit 0 only when /v1/health/ready answers 200 (a Dynamo worker's: its /health)."""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request

from runtimes.health import READY
from runtimes.settings import Settings, SettingsError


def main() -> int:
    try:
        settings = Settings.from_env()
    except SettingsError:
        return 1
    if settings.dynamo_system_port is not None:  # a Dynamo worker: ready once its endpoint is registered
        return _ok(f"http://127.0.0.1:{settings.dynamo_system_port}/health", None)
    port = settings.port
    scheme, context = "http", None
    if settings.ssl_certfile:
        # The probe asks its own server on loopback: the certificate names the public host, not 127.0.0.1.
        scheme, context = "https", ssl._create_unverified_context()
    return _ok(f"{scheme}://127.0.0.1:{port}{READY}", context)


def _ok(url: str, context: ssl.SSLContext | None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
