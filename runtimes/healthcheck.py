"""The image's HEALTHCHECK: exit 0 only when /v1/health/ready answers 200."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("MBUILD_PORT", "8000")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health/ready", timeout=3) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
