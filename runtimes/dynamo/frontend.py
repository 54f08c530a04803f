"""`python3 -m runtimes.dynamo.frontend ARGS`: Dynamo's frontend (`python3 -m dynamo.frontend ARGS`) in a container
of this image that runs no worker (a DynamoGraphDeployment's Frontend pod, or `docker run` beside worker containers).

The frontend reads a worker's model card from the path the worker registered when that path is visible to it
(Dynamo's rule for local models: the same files at the same path on every node). The card is written from the
image's model folder and named by its content (card.py), so this writes the very folder each worker of the image
registered, then starts the frontend in this process.

Dynamo's KV router picks the worker with the least prompt blocks to prefill plus blocks its running sequences hold,
the two weighed 1:1 by default, as on a GPU. On a CPU engine (ONNX Runtime) a prompt block's prefill runs every
weight for 16 tokens while a running sequence's blocks cost only their attention reads, so by default the frontend of
a CPU image weighs prefill CPU_PREFILL_LOAD_SCALE times (DYN_ROUTER_PREFILL_LOAD_SCALE, Dynamo's own; an operator's
value of it, or --router-prefill-load-scale, wins). Measured on two CPU replicas (docs/benchmarks/routing.md): at 1:1
a conversation's turns bounced off the replica holding them whenever it ran one more sequence.

With MBUILD_API_KEY set, Dynamo's frontend runs as a child on a loopback port and gate.py takes the address asked
for (--http-host/--http-port, or Dynamo's DYN_HTTP_HOST/DYN_HTTP_PORT): Dynamo checks no key itself.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import uvicorn

from runtimes.bundle import BundleError, EngineConfig, load_engine_config
from runtimes.dynamo.card import write_card
from runtimes.dynamo.gate import Gate
from runtimes.exits import Exit
from runtimes.settings import Settings, SettingsError, export_default

CPU_PREFILL_LOAD_SCALE = 16  # routing.md: scales 4, 16 and 64 measured beside Dynamo's 1; 16 and 64 alike, 4 short
LOOPBACK = "127.0.0.1"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SECONDS = 5  # within `mbuild serve --replicas`' own 10 s before it kills this process


def router_defaults(config: EngineConfig) -> dict[str, str]:
    """Dynamo's router variables this engine wants where the operator set none."""
    return {"DYN_ROUTER_PREFILL_LOAD_SCALE": str(CPU_PREFILL_LOAD_SCALE)} if config.engine == "onnxruntime" else {}


def split_address(argv: list[str], settings: Settings) -> tuple[str, int, list[str]]:
    """The address Dynamo's frontend would listen on (its own flags, variables and defaults), and the other args."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--http-host", default=settings.dynamo_http_host or "0.0.0.0")
    parser.add_argument("--http-port", type=int, default=settings.dynamo_http_port or 8000)
    known, rest = parser.parse_known_args(argv)
    return known.http_host, known.http_port, rest


def _die_with_parent() -> None:
    """In the frontend child: SIGTERM when the gate's process ends, however it ends (Linux's PR_SET_PDEATHSIG), so a
    killed gate never leaves an ungated frontend behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def gated(argv: list[str], settings: Settings) -> int:
    """Dynamo's frontend on a loopback port, the gate on the asked-for address; ends when either does."""
    assert settings.api_key is not None
    host, port, rest = split_address(argv, settings)
    inner = _loopback_port()
    child = subprocess.Popen([sys.executable, "-m", "dynamo.frontend", "--http-host", LOOPBACK,
                              "--http-port", str(inner), *rest], preexec_fn=_die_with_parent)
    gate = Gate(f"http://{LOOPBACK}:{inner}", settings.api_key, settings.protect_metrics)
    server = uvicorn.Server(uvicorn.Config(gate, host=host, port=port, log_level="warning",
                                           timeout_keep_alive=settings.keepalive_seconds))

    async def watch() -> None:  # the frontend ended: so does the gate, with its exit status
        while child.poll() is None and not server.should_exit:
            await asyncio.sleep(0.2)
        server.should_exit = True

    async def run() -> None:
        watcher = asyncio.create_task(watch())
        await server.serve()
        await watcher
    try:
        asyncio.run(run())
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
    # ended by itself: its status; stopped by the gate (a signal's negative status): a clean stop
    return child.returncode if child.returncode and child.returncode > 0 else 0


def main(argv: list[str]) -> int:
    try:
        settings = Settings.from_env()
        config = load_engine_config(settings.model_dir)
    except (SettingsError, BundleError) as exc:
        print(f"mbuild frontend: {exc}", file=sys.stderr)
        return Exit.BROKEN_BUNDLE
    write_card(settings.model_dir, config, Path(tempfile.gettempdir()))
    for name, value in router_defaults(config).items():
        export_default(name, value)
    if settings.auth_notice:
        print(f"mbuild frontend: {settings.auth_notice}", file=sys.stderr)
    if settings.api_key is not None:
        return gated(argv, settings)
    sys.argv = ["dynamo.frontend", *argv]
    runpy.run_module("dynamo.frontend", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
