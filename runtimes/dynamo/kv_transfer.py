"""Moving a prompt's KV from a Dynamo prefill worker to a decode worker, over TCP.

Dynamo moves KV with NIXL, whose wheels are CUDA-only; its protocol leaves the move to the engine (the prefill
worker's last chunk carries `disaggregated_params`, which the frontend hands to the decode worker). Here the
prefill worker serves what its prefix cache holds (KvServer), and the decode worker pulls the prompt's blocks
(fetch) and keeps them in its own prefix cache, where admitting the request finds them like any cached prefix.
Measured before it was built: moving a slot costs a few percent of prefilling it (docs/benchmarks/kv_transfer.md).

One exchange per connection: the decode side sends a length-prefixed JSON {"tokens": [...]}; the prefill side
answers with a length-prefixed JSON header {"length": L, "shapes": [...], "dtype": ...} and the blocks' bytes.
Both sides bound every size and check every shape against their own engine's, so a confused or hostile peer costs
a recomputed prefill, never a wrong cache.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable

import numpy as np

from runtimes.generation.prefix_cache import BLOCK

log = logging.getLogger("mbuild.dynamo")
HEADER_MAX = 8 << 20  # bytes of a JSON message: a 128k-token prompt's ids fit
TIMEOUT = 30.0  # seconds a connection may stall
Export = Callable[[list[int]], tuple[int, list[np.ndarray]]]  # PrefixCache.export


class TransferError(Exception):
    """The KV could not be moved; the decode worker prefills the prompt itself."""


def _send(sock: socket.socket, message: dict[str, object]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        got = sock.recv(min(size - len(data), 1 << 20))
        if not got:
            raise TransferError(f"the peer closed the connection after {len(data)} of {size} bytes")
        data += got
    return bytes(data)


def _receive(sock: socket.socket) -> dict[str, object]:
    size = int.from_bytes(_exact(sock, 4), "big")
    if size > HEADER_MAX:
        raise TransferError(f"a message of {size} bytes is over {HEADER_MAX}")
    try:
        message = json.loads(_exact(sock, size))
    except ValueError as exc:
        raise TransferError(f"a message that is not JSON ({exc})") from exc
    if not isinstance(message, dict):
        raise TransferError("a message that is not a JSON object")
    return message


def _tokens(value: object, limit: int) -> list[int]:
    if not isinstance(value, list) or len(value) > limit or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31 for t in value):
        raise TransferError(f"tokens must be a list of at most {limit} token ids")
    return value


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a restarted prefill worker takes its fixed port (--kv-port) back at once
    daemon_threads = True


class KvServer:
    """Serves the prefix cache's blocks for the prompts decode workers name, on (host, port; 0: an ephemeral one)."""

    def __init__(self, host: str, port: int, export: Export, context: int) -> None:
        self.export, self.context = export, context
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(TIMEOUT)
                try:
                    owner.answer(self.request)
                except (OSError, TransferError) as exc:
                    log.warning("a KV transfer to %s failed: %s", self.client_address, exc)

        self.server = _Server((host, port), Handler)
        self.address = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="kv-transfer", daemon=True)
        self.thread.start()

    def answer(self, sock: socket.socket) -> None:
        tokens = _tokens(_receive(sock).get("tokens"), self.context)
        length, blocks = self.export(tokens)
        _send(sock, {"length": length, "shapes": [list(b.shape) for b in blocks],
                     "dtype": blocks[0].dtype.str if blocks else ""})
        for block in blocks:
            sock.sendall(np.ascontiguousarray(block).data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fetch(address: str, tokens: list[int], shapes: list[tuple[int, int]], dtype: np.dtype) -> tuple[
        int, list[np.ndarray]]:
    """The prompt's leading positions the prefill worker at `address` holds, as blocks shaped like this engine's
    (shapes: each buffer's (heads, head_dim)); raises TransferError."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"{address!r} is not host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
            _send(sock, {"tokens": tokens})
            header = _receive(sock)
            length = header.get("length")
            if not isinstance(length, int) or not 0 <= length <= len(tokens) or length % BLOCK:
                raise TransferError(f"a length of {length!r} for a prompt of {len(tokens)} tokens")
            if length == 0:
                return 0, []
            expected = [[heads, length, dim] for heads, dim in shapes]
            if header.get("shapes") != expected or header.get("dtype") != dtype.str:
                raise TransferError(f"blocks {header.get('shapes')} of {header.get('dtype')}, expected {expected} "
                                    f"of {dtype.str}")
            blocks = [np.frombuffer(_exact(sock, heads * length * dim * dtype.itemsize), dtype).reshape(
                heads, length, dim) for heads, dim in shapes]
            return length, blocks
    except OSError as exc:
        raise TransferError(f"{address}: {exc}") from exc
