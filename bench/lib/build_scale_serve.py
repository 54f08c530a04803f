"""The serving half of build_scale: the engine a scale build made, served by `mbuild serve` on this host, its
memory at ready and through one streamed answer (chat where the model has a template), against what `mbuild plan`
predicts at ready (memory.start_gb: weights as stored and the serving processes; a CPU server commits KV pages as
sequences fill them).
Random weights fail the quantized gates, so the engine is served with --allow-failed-gate.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.lib.mbuild import MBUILD
from bench.lib.rss import tree_memory
from bench.lib.servers import HOST, free_port
from builder.serving.ready import Outcome, wait_ready
from runtimes.bundle import load_engine_config

READY_WITHIN_S = 1800  # an 8B engine loads from disk and prepacks its weights on two cores


def _stream(base: str, model: str, chat: bool) -> tuple[int, str]:
    """One streamed answer of 16 tokens: a chat completion, or a plain completion for a model with no chat template
    (the 100m shape's SPM tokenizer has none; the Llama 3 ones do)."""
    ask = "Say hello in five words."
    payload = {"model": model, "max_tokens": 16, "min_tokens": 16, "stream": True, "temperature": 0,
               **({"messages": [{"role": "user", "content": ask}]} if chat else {"prompt": ask})}
    pieces = []
    route = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.stream("POST", f"{base}{route}", json=payload, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{route}: HTTP {response.status_code} {response.read()[:300]!r}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices")
                piece = (choices[0]["delta"].get("content") if chat else choices[0].get("text")) if choices else None
                if piece:
                    pieces.append(piece)
    return len(pieces), "".join(pieces)


def serve_arm(build: Path, env: dict[str, str]) -> dict[str, Any]:
    """Serve `build`, stream one answer (a chat completion where the model has a chat template), and report the
    tree's RSS at ready and at its peak."""
    port = free_port()
    base = f"http://{HOST}:{port}"
    started = time.perf_counter()
    log = build.parent / f"{build.name}-serve.log"
    with log.open("w") as sink:  # a file, not a pipe: a pipe nobody reads would stall the server when full
        proc = subprocess.Popen([*MBUILD, "serve", str(build), "--host", HOST, "--port", str(port),
                                 "--allow-failed-gate"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    root = psutil.Process(proc.pid)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_memory(root)[0])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        found = wait_ready(base, READY_WITHIN_S, watch=[proc.poll], every_s=1, ask_s=5)
        if found.outcome is Outcome.ENDED:
            return {"error": f"mbuild serve exited {found.returncode}: {log.read_text()[-600:]}"}
        if found.outcome is Outcome.TIMED_OUT:
            return {"error": f"not ready within {READY_WITHIN_S}s"}
        ready_s = time.perf_counter() - started
        at_ready = tree_memory(root)[0]
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        chat_started = time.perf_counter()
        chunks, text = _stream(base, model, bool(load_engine_config(build / "model").decoder.chat_template))
        return {"ready_s": round(ready_s, 1), "rss_at_ready": at_ready, "peak_rss": max(peak[0], at_ready),
                "chat_chunks": chunks, "chat_text": text, "chat_s": round(time.perf_counter() - chat_started, 1)}
    finally:
        done.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the runtime's workers with it
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
