"""Servers a benchmark starts on loopback: a free port, a process group, ready when a route says 200."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.lib.loadgen import Load, closed_loop
from bench.lib.mbuild import MBUILD
from builder.serving.ready import MODELS, Outcome, lists_model, wait_ready

HOST = "127.0.0.1"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def served_name(port: int) -> str:
    """The model name an OpenAI-style server on `port` serves (its first /v1/models entry)."""
    return str(httpx.get(f"http://{HOST}:{port}/v1/models", timeout=10).json()["data"][0]["id"])


def mbuild_serve(build: Path, port: int) -> list[str]:
    return [*MBUILD, "serve", str(build), "--host", HOST, "--port", str(port)]


def uvicorn_app(app: str, port: int, python: Path | None = None) -> list[str]:
    """A plain ASGI app (a baseline arm) on uvicorn, quiet, with no access log."""
    return [str(python or sys.executable), "-m", "uvicorn", app, "--host", HOST, "--port", str(port),
            "--log-level", "warning", "--no-access-log"]


@contextmanager
def server(command: list[str], ready_path: str, port: int, env: dict[str, str] | None = None,
           cpus: set[int] | None = None, cwd: Path | None = None, started: list[int] | None = None) -> Iterator[int]:
    """`command` serving on `port`, optionally pinned to `cpus` (its threads inherit the mask); `started` gets its
    process id (the root of the tree a memory reading sums)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **(env or {})}, cwd=cwd)
    if started is not None:
        started.append(proc.pid)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        found = wait_ready(f"http://{HOST}:{port}", 180, watch=[proc.poll], paths=(ready_path,))
        if found.outcome is Outcome.ENDED:
            raise RuntimeError(f"{command} exited with {found.returncode}")
        if found.outcome is Outcome.TIMED_OUT:
            raise RuntimeError(f"{command} was not ready within 180s")
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already (a failed start)
            os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def split_cores() -> tuple[set[int], set[int]]:
    """(client, servers): the load generator on the first core, the servers on the rest, so neither steals
    the other's time; on a single core both share it."""
    cores = sorted(os.sched_getaffinity(0))
    return ({cores[0]}, set(cores[1:]) or {cores[0]})


@contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """Run this process (the client) on `cpus` for the block."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def dynamo_frontend(stack: contextlib.ExitStack, build: Path, *args: str, ready_seconds: float = 300,
                    env: dict[str, str] | None = None) -> str:
    """`mbuild serve BUILD --replicas ... ARGS` up in `stack` (with `env` added) until its workers have registered the
    model (the frontend answers before they do); its base URL."""
    port = free_port()
    stack.enter_context(server([*MBUILD, "serve", str(build), "--host", HOST, "--port", str(port), *args],
                               MODELS, port, env))
    base = f"http://{HOST}:{port}"
    if wait_ready(base, ready_seconds, paths=(MODELS,), check=lists_model(), ask_s=10).outcome is not Outcome.READY:
        raise RuntimeError(f"no worker registered the model within {ready_seconds:g} s")
    return base


def timed_rate(name: str, port: int, request: bytes, concurrency: int, client: set[int], loads: list[Load],
               seconds: float, per_request: int = 1) -> float:
    """One timed case: a closed loop of `request` at `concurrency` from the client's cores, kept in `loads`; the
    items it answered a second (requests/s x per_request). Any answer but a 200 fails the case."""
    with pinned(client):
        load = closed_loop(HOST, port, request, concurrency, seconds)
    if load.failures:
        raise RuntimeError(f"{name}: non-200 answers {load.failures}")
    loads.append(load)
    return load.rate * per_request
