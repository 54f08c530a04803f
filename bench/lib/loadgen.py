"""A closed-loop HTTP/1.1 load generator: N keep-alive connections, each sending the next request on an answer.

Deliberately bare (pre-encoded request bytes, a minimal response parser) so the client costs little CPU on
a machine it shares with the server; every arm of a benchmark uses this same client.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Load:
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: dict[int, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")

    @property
    def p99_ms(self) -> float:
        if len(self.latencies) < 2:
            return float("nan")
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[98] * 1000


def post(host: str, port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    payload = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def get(host: str, port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"transfer-encoding":
            raise RuntimeError("chunked responses are not supported by this load generator")
    await reader.readexactly(length)
    return status


async def _closed_loop(host: str, port: int, request: bytes, concurrency: int, seconds: float) -> Load:
    load = Load()

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status = await _exchange(reader, writer, request)
                if status == 200:
                    load.latencies.append(time.perf_counter() - started)
                else:
                    load.failures[status] = load.failures.get(status, 0) + 1
        finally:
            writer.close()

    began = time.perf_counter()
    deadline = began + seconds
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    load.seconds = time.perf_counter() - began
    return load


def closed_loop(host: str, port: int, request: bytes, concurrency: int, seconds: float) -> Load:
    """`concurrency` connections for `seconds`; a non-200 answer is counted, never timed."""
    return asyncio.run(_closed_loop(host, port, request, concurrency, seconds))
