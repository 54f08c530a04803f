"""Disaggregated prefill and decode, measured first: moving a prefilled slot's KV to another worker, or computing it.

Model: the ~100M random Llama of the routing benchmark (bench/lib/llm_models.py), its default build (`mbuild package
--gpu cpu`), loaded as the server loads it (runtimes/engines/decoder.py's DecoderEngine, one intra-op thread, on one
pinned core). For each prompt length: the prefill, in the server's 512-token chunks, against the move of the same
positions to a second worker: the slot read out of the cache (DecoderEngine.read, as the prefix cache takes it), sent
over loopback TCP to a receiver process on the other core that takes it into a buffer of its own (recv_into: what a
pulling decode worker would do, and what Dynamo's NIXL does on GPUs), and written into a slot (DecoderEngine.write).
Medians of the rounds. Shared memory would skip the socket: the read and write alone bound it from below.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_100M, LLAMA_TINY, make_llama_words
from bench.lib.mbuild import build_mbuild, source_hash
from bench.lib.servers import HOST, free_port, pinned, split_cores
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "moving a prefilled slot's KV against computing it again"

CHUNK = 512  # the server's MBUILD_PREFILL_CHUNK default: how a prompt is prefilled
RECEIVER = """
import socket, sys
import numpy as np
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        size = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "little")
        if size == 0:
            break
        view, got = memoryview(np.empty(size, np.uint8)), 0
        while got < size:
            got += conn.recv_into(view[got:], size - got)
        conn.sendall(b"k")
"""


def _send(port: int, blocks: list[np.ndarray]) -> None:
    with socket.create_connection((HOST, port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(sum(b.nbytes for b in blocks).to_bytes(8, "little"))
        for block in blocks:
            conn.sendall(np.ascontiguousarray(block).data)
        conn.recv(1)


def measure(engine: DecoderEngine, lengths: tuple[int, ...], rounds: int, port: int) -> dict[int, dict[str, float]]:
    vocab = engine.config.decoder.vocab_size
    found: dict[int, dict[str, list[float]]] = {n: {} for n in lengths}
    for round_ in range(rounds + 1):  # the first round warms up and is not kept
        for n in lengths:
            ids = np.random.default_rng(round_).integers(3, vocab, (1, n))
            engine.release(0)
            start = time.perf_counter()
            for at in range(0, n, CHUNK):
                engine.run(0, ids[:, at:at + CHUNK])
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            blocks = engine.read(0, n)
            read = time.perf_counter() - start
            start = time.perf_counter()
            _send(port, blocks)
            sent = time.perf_counter() - start
            start = time.perf_counter()
            engine.write(1, blocks, n)
            written = time.perf_counter() - start
            if round_:
                for key, value in (("prefill", prefill), ("read", read), ("send", sent), ("write", written)):
                    found[n].setdefault(key, []).append(value * 1000)
    return {n: {key: statistics.median(values) for key, values in kinds.items()} for n, kinds in found.items()}


def report(results: dict[int, dict[str, float]], bytes_per_token: int, rounds: int, command: str,
           quick: bool) -> tuple[dict[str, Any], str]:
    lines = ["| prompt tokens | KV MB | prefill ms | read ms | loopback TCP ms | write ms | move ms | move GB/s "
             "| move / prefill |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, t in results.items():
        move = t["read"] + t["send"] + t["write"]
        size = n * bytes_per_token
        lines.append(f"| {n} | {size / 1e6:.1f} | {t['prefill']:.0f} | {t['read']:.1f} | {t['send']:.1f} | "
                     f"{t['write']:.1f} | {move:.1f} | {size / move / 1e6:.2f} | {move / t['prefill']:.3f} |")
    m = machine()
    markdown = "\n".join([
        "# Moving a prefilled slot's KV against computing it again" + (" (quick smoke run)" if quick else ""), "",
        (__doc__ or "").strip(), "", f"Machine: {m['cores']} cores ({m['cpu']}), {m['date']}; {rounds} round(s), "
        f"medians; KV {bytes_per_token} bytes a token (fp32 keys and values).", "", *lines, "",
        "move = read + loopback TCP + write: what a decode worker pays to take a slot another worker prefilled.", "",
        f"Reproduce: `{command}`.", ""])
    data = {"scenario": "kv_transfer", "machine": m, "command": command, "rounds": rounds, "quick": quick,
            "bytes_per_token": bytes_per_token, "results": {str(k): v for k, v in results.items()}}
    return data, markdown


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench kv_transfer`. Quick: the tiny Llama, short prompts, one round, into a scratch folder."""
    work = work or work_folder("kv_transfer", quick)
    work.mkdir(parents=True, exist_ok=True)
    key, shape = ("tiny", LLAMA_TINY) if quick else ("100m", LLAMA_100M)
    model = make_llama_words(work / f"llama-{key}-words", shape)
    model_dir = build_mbuild(model, work / f"mbuild-{model.name}-{source_hash()}", precision=None)
    lengths = (128, 256) if quick else (512, 1024, 2048)
    rounds = 1 if quick else repeats
    mine, theirs = split_cores()
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, HOST, str(port)], stdout=subprocess.PIPE,
                                preexec_fn=lambda: os.sched_setaffinity(0, mine))
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == b"ready"
        with pinned(theirs):
            engine = DecoderEngine(model_dir, load_engine_config(model_dir), threads=1, slots=2)
            results = measure(engine, lengths, rounds, port)
        _send(port, [])  # a zero size ends the receiver
        receiver.wait(10)
    finally:
        receiver.kill()
    command = f"python -m bench kv_transfer {'--quick' if quick else f'--repeats {repeats}'}"
    data, markdown = report(results, engine.bytes_per_token, rounds, command, quick)
    path = write("kv_transfer", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
