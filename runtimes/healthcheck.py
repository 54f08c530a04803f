"""The image's HEALTHCHECK: exit 0 only when /v1/health/ready answers 200."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("MBUILD_PORT", "8000")
    scheme, context = "http", None
    if os.environ.get("MBUILD_SSL_CERTFILE"):
        # The probe asks its own server on loopback: the certificate names the public host, not 127.0.0.1.
        scheme, context = "https", ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/v1/health/ready", timeout=3,
                                    context=context) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
