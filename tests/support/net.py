"""Loopback helpers: free ports and waiting for a URL to answer."""

from __future__ import annotations

import random
import socket
import ssl
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port the kernel hands out (bind to 0) can be taken as the
    local end of any outbound connection (a client, a docker pull) before the server under test binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000..{low}")


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
