"""Loopback helpers: free ports and waiting for a URL to answer."""

from __future__ import annotations

import socket
import ssl
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_status(url: str, status: int = 200, timeout: float = 90.0, verify: ssl.SSLContext | bool = True) -> float:
    """Poll url until it answers `status`; return the seconds it took. Raises TimeoutError."""
    start = time.monotonic()
    last = "no answer"
    while time.monotonic() - start < timeout:
        try:
            code = httpx.get(url, timeout=2, verify=verify).status_code
            if code == status:
                return time.monotonic() - start
            last = f"HTTP {code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s (last: {last})")
