"""`mbuild serve BUILD --replicas N`: N copies of a build's runtime behind NVIDIA Dynamo's frontend and router, on
this host, as one OpenAI endpoint.

The frontend (`python -m runtimes.dynamo.frontend`: Dynamo's, with the image's card and router defaults) tokenizes,
routes (`--router kv`: to the replica whose prefix cache holds the longest part of the prompt, by the KV events each
publishes, weighed against its load; `round-robin`) and detokenizes; each replica is
`python -m runtimes.dynamo` (runtimes/dynamo/engine.py), pinned to its own share of this process's cores. Discovery
is a folder made for the run (Dynamo's file backend), requests go over TCP and events over ZMQ: no etcd, no NATS.
One process group: when any of them ends, or on Ctrl+C or SIGTERM, all are stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError, MbuildError
from builder.serving.event_broker import event_broker
from builder.serving.ready import MODELS, Outcome, lists_model, wait_ready
from runtimes.dynamo import FRONTEND_MODULE, PLANES, WORKER_MODULE

# Dynamo's own variables for where its internal servers listen (by default every interface, or the host's address):
# the workers' request plane, the frontend's response streams, the KV event publishers, the status servers. On one
# host they talk over loopback, so nothing but the frontend (or its key gate) listens beyond --host.
INTERNAL_HOSTS = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST", "DYN_SYSTEM_HOST")
READY_SECONDS = 300  # a replica loads and warms its engine before the frontend lists the model
STOP_SECONDS = 10


def core_shares(cores: Sequence[int], replicas: int) -> list[list[int]]:
    """Each replica's cores: the host's split evenly, in order; replicas beyond the cores share them round."""
    ordered = sorted(cores)
    if replicas <= len(ordered):
        size = len(ordered) // replicas
        return [ordered[i * size:(i + 1) * size] for i in range(replicas)]
    return [[ordered[i % len(ordered)]] for i in range(replicas)]


@dataclass(frozen=True)
class Replicas:
    model_dir: Path
    served_name: str
    replicas: int
    router: str
    host: str
    port: int
    env: dict[str, str]  # the children's environment (builder/settings.child_env: the runtime's path and settings)
    prefill: int = 0  # of the replicas, how many only prefill and hand the KV to the others, which only decode

    def commands(self, discovery: Path, broker: str) -> list[tuple[list[str], dict[str, str], list[int] | None]]:
        """(argv, environment, cores) of the frontend, then of each replica; broker: event_broker's URL."""
        base = {**self.env, "DYN_FILE_KV": str(discovery), "PYTHONUNBUFFERED": "1", "DYN_ZMQ_BROKER_URL": broker,
                **{name: "127.0.0.1" for name in INTERNAL_HOSTS}}
        planes = ["--discovery-backend", "file", *PLANES]
        front = [sys.executable, "-m", FRONTEND_MODULE, "--http-host", self.host, "--http-port", str(self.port),
                 "--router-mode", self.router, *planes]  # the image's frontend: its card, its router defaults
        found: list[tuple[list[str], dict[str, str], list[int] | None]] = [
            (front, {**base, "MBUILD_MODEL_DIR": str(self.model_dir)}, None)]
        for n, share in enumerate(core_shares(sorted(os.sched_getaffinity(0)), self.replicas)):
            env = {**base, "MBUILD_MODEL_DIR": str(self.model_dir), "MBUILD_SERVED_MODEL_NAME": self.served_name,
                   "MBUILD_THREADS": str(len(share))}
            role = [] if not self.prefill else ["--disaggregation-mode", "decode"] if n >= self.prefill else [
                "--disaggregation-mode", "prefill", "--kv-host", "127.0.0.1"]
            found.append(([sys.executable, "-m", WORKER_MODULE, *planes, *role], env, share))
        return found


def _start(argv: list[str], env: dict[str, str], cores: list[int] | None) -> subprocess.Popen[bytes]:
    def pin() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
    return subprocess.Popen(argv, env=env, preexec_fn=pin)


def _ready(url: str, name: str, children: list[subprocess.Popen[bytes]], key: str | None) -> None:
    """Until the frontend lists the model (its workers have registered it), or any process ends."""
    found = wait_ready(url, READY_SECONDS, watch=[child.poll for child in children], paths=(MODELS,),
                       check=lists_model(name), api_key=key)
    if found.outcome is Outcome.ENDED and found.ended is not None:
        raise MbuildError(f"a serving process ended while starting (exit {found.returncode}): "
                          f"{children[found.ended].args!r}", hint="its log is above")
    if found.outcome is Outcome.TIMED_OUT:
        raise MbuildError(f"the model did not come up behind Dynamo's frontend within {READY_SECONDS} s")


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in reversed(children):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()


def serve_replicas(plan: Replicas, announce: Callable[[str], None] = print) -> int:
    """Run until a process ends or a signal comes; the exit status to leave with."""
    try:
        import dynamo.frontend  # noqa: F401 - present, or say how to get it
    except ImportError as exc:
        raise InputError("--replicas serves through NVIDIA Dynamo, which is not installed here",
                         hint='pip install "mbuild[dynamo]" and then pip install --no-deps ai-dynamo==1.6.1 '
                              "(docs/deploy.md says why --no-deps)") from exc
    discovery = Path(tempfile.mkdtemp(prefix="mbuild-dynamo-"))
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with event_broker() as broker:
            for argv, env, cores in plan.commands(discovery, broker):
                children.append(_start(argv, env, cores))
            try:
                url = f"http://{plan.host}:{plan.port}"
                _ready(url, plan.served_name, children, (plan.env.get("MBUILD_API_KEY") or "").strip() or None)
                announce(f"serving {plan.served_name} on {url}: {plan.replicas} replica(s) behind Dynamo's "
                         f"{plan.router} router (Ctrl+C stops them all)")
                while not stopping and all(child.poll() is None for child in children):
                    time.sleep(0.2)
                ended = next((child for child in children if child.poll() is not None), None)
                return 0 if stopping or ended is None else (ended.returncode or 1)
            finally:
                _stop(children)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(discovery, ignore_errors=True)
