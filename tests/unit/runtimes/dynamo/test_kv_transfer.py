"""A prompt's KV moved between two workers' prefix caches (runtimes/dynamo/kv_transfer.py) over real loopback
sockets: the blocks arrive equal and the receiving cache restores them like its own; whatever a confused or hostile
peer sends (the wrong shapes, dtype or length, a cut-off stream, no server at all) is a TransferError, which costs
the decode worker a prefill, never a wrong cache."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from runtimes.dynamo.kv_transfer import KvServer, TransferError, fetch
from runtimes.generation.prefix_cache import BLOCK, PrefixCache
from tests.support.scheduler_fakes import FakeEngine

HEADS, DIM, LAYERS, CONTEXT = 2, 4, 3, 256
SHAPES = [(HEADS, DIM)] * (2 * LAYERS)


class Slots(FakeEngine):
    """The fake engine with its slots' caches as DecoderEngine keeps them: per buffer (slots, heads, context,
    head_dim), fp32, which the prefix cache reads and writes."""

    bytes_per_token = len(SHAPES) * HEADS * DIM * 4

    def __init__(self, seed: int) -> None:
        super().__init__(slots=2)
        rng = np.random.default_rng(seed)
        self.cache = [rng.standard_normal((2, HEADS, CONTEXT, DIM)).astype(np.float32) for _ in SHAPES]

    def read(self, row: int, count: int) -> list[np.ndarray]:
        return [buffer[row, :, :count].copy() for buffer in self.cache]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        for buffer, block in zip(self.cache, blocks, strict=True):
            buffer[row, :, :count] = block[:, :count]

    def copy(self, source: int, row: int, count: int) -> None:
        self.write(row, self.read(source, count), count)

    def keep(self, row: int, count: int) -> None:
        pass


@pytest.fixture
def prefill() -> Iterator[tuple[KvServer, Slots, list[int]]]:
    slots, prompt = Slots(1), list(range(3, 3 + 3 * BLOCK + 5))
    cache = PrefixCache(1 << 30, slots)
    cache.pin(0, prompt)  # what the prefill worker's scheduler does when the prompt's prefill ends: read in place
    server = KvServer("127.0.0.1", 0, cache.export, CONTEXT)
    yield server, slots, prompt
    server.close()


def test_the_blocks_arrive_equal_and_the_decode_cache_restores_them(prefill: tuple[KvServer, Slots, list[int]]
                                                                    ) -> None:
    server, slots, prompt = prefill
    length, blocks = fetch(server.address, prompt, SHAPES, np.dtype(np.float32))
    assert length == 3 * BLOCK  # the whole blocks of the prompt
    for got, want in zip(blocks, slots.read(0, length), strict=True):
        np.testing.assert_array_equal(got, want)
    decode, mine = PrefixCache(1 << 30), Slots(2)
    decode.adopt(prompt[:length], blocks, length * mine.bytes_per_token)
    assert decode.restore(mine, 1, prompt) == length  # admission finds it like any cached prefix
    for buffer, want in zip(mine.cache, slots.read(0, length), strict=True):
        np.testing.assert_array_equal(buffer[1, :, :length], want)


def test_an_unknown_prompt_moves_nothing(prefill: tuple[KvServer, Slots, list[int]]) -> None:
    server, _, _ = prefill
    assert fetch(server.address, list(range(500, 600)), SHAPES, np.dtype(np.float32)) == (0, [])


@pytest.mark.parametrize(("shapes", "dtype", "said"), [
    ([(HEADS, DIM)] * 2, np.float32, "expected"),  # another model's layers
    ([(HEADS, DIM + 1)] * (2 * LAYERS), np.float32, "expected"),  # another head size
    (SHAPES, np.float16, "expected"),  # another cache type
])
def test_blocks_of_another_shape_are_refused(prefill: tuple[KvServer, Slots, list[int]], shapes: list[tuple[int, int]],
                                             dtype: type, said: str) -> None:
    server, _, prompt = prefill
    with pytest.raises(TransferError, match=said):
        fetch(server.address, prompt, shapes, np.dtype(dtype))


def _fake_peer(answer: Callable[[socket.socket], None]) -> str:
    """A peer that reads the request and answers as `answer` does."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            size = int.from_bytes(conn.recv(4), "big")
            while size > 0:
                size -= len(conn.recv(size))
            answer(conn)
    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def _header(message: object) -> bytes:
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data


@pytest.mark.parametrize(("answer", "said"), [
    (lambda c: c.sendall(_header({"length": 20, "shapes": [], "dtype": "<f4"})), "a length of 20"),  # not a block
    (lambda c: c.sendall(_header({"length": 10 * BLOCK, "shapes": [], "dtype": "<f4"})), "a length of"),  # > prompt
    (lambda c: c.sendall((1 << 30).to_bytes(4, "big")), "over"),  # a header too large to take
    (lambda c: c.sendall(b"\x00\x00\x00\x05[1,2"), "closed"),  # cut off
    (lambda c: c.sendall(_header([1, 2])), "not a JSON object"),
    (lambda c: c.sendall(_header({"length": BLOCK, "shapes": [[HEADS, BLOCK, DIM]] * len(SHAPES), "dtype": "<f4"})
                         + b"\x00" * 64), "closed"),  # fewer bytes than the shapes say
])
def test_a_hostile_peer_is_a_transfer_error(answer: Callable[[socket.socket], None], said: str) -> None:
    with pytest.raises(TransferError, match=said):
        fetch(_fake_peer(answer), list(range(3 * BLOCK + 1)), SHAPES, np.dtype(np.float32))


def test_no_peer_and_a_bad_address_are_transfer_errors() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
    for address in (f"127.0.0.1:{port}", "no-port", "host:http"):
        with pytest.raises(TransferError):
            fetch(address, [1, 2, 3], SHAPES, np.dtype(np.float32))


def test_the_server_refuses_a_prompt_longer_than_the_context(prefill: tuple[KvServer, Slots, list[int]]) -> None:
    server, _, _ = prefill
    with pytest.raises(TransferError, match="closed"):  # it answers nothing and ends the connection
        fetch(server.address, list(range(CONTEXT + 1)), SHAPES, np.dtype(np.float32))
