"""`mbuild serve BUILD_DIR`: run a build's service on this host, as the image would."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from builder.engine.report import REPORT_FILE, read_report
from builder.errors import InputError, PortBusy, ValidationFailed
from builder.resources import runtime_env
from builder.serving import ROUTERS
from runtimes.bundle import ENGINE_FILE, BundleError, load_engine_config, load_metadata
from runtimes.settings import PORT


def _gate(build_dir: Path, allow_failed: bool) -> str | None:
    """The build's gate summary; a failed or missing gate stops here unless the user allows it."""
    report = read_report(build_dir / "model" / REPORT_FILE)
    passed = report is not None and report.passed
    summary = report.summary if report else f"no readable model/{REPORT_FILE}: this engine was never validated"
    if passed:
        return None
    if not allow_failed:
        raise ValidationFailed(f"{build_dir} failed its numerical gate: {summary}",
                               hint="rebuild with another precision or profile; --allow-failed-gate serves it "
                                    "anyway (its answers may be wrong)")
    return f"warning: serving an engine that failed its numerical gate: {summary}"


def _check_port(host: str, port: int) -> None:
    """Bind once before starting anything: a busy port is a message, not a server traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(f"--host {host!r} is not an address of this machine: {exc.strerror}") from exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortBusy(f"cannot listen on {host}:{port}: {exc.strerror}",
                           hint="choose another --port, or stop what listens there") from exc


def _replicated(model_dir: Path, replicas: int, router: str, host: str, port: int, env: dict[str, str],
                prefill: int) -> int:
    config = load_engine_config(model_dir)
    if config.task != "text-generation":
        raise InputError(f"--replicas serves language models through Dynamo; {model_dir} holds a {config.task} "
                         "model", hint="serve it without --replicas, or run more containers behind a Service")
    from builder.serving.replicas import Replicas, serve_replicas  # httpx and Dynamo's plumbing: only for --replicas

    metadata = load_metadata(model_dir)
    name = env.get("MBUILD_SERVED_MODEL_NAME") or (metadata.model.repo if metadata else "model")
    plan = Replicas(model_dir.resolve(), name, replicas, router, host, port, env, prefill)
    return serve_replicas(plan, lambda line: click.echo(line, err=True))


@click.command()
@click.argument("build_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--allow-failed-gate", is_flag=True, help="Serve an engine that failed its numerical gate.")
@click.option("--replicas", type=click.IntRange(1, 64), default=None,
              help="Serve this many copies behind NVIDIA Dynamo's frontend and router, one endpoint, the host's "
                   "cores split between them (a language model; needs the dynamo extra).")
@click.option("--router", type=click.Choice(ROUTERS), default=None,
              help="With --replicas: kv sends a request to the copy whose cache holds most of its prompt "
                   "(default); round-robin takes turns.")
@click.option("--prefill-workers", type=click.IntRange(0, 63), default=0, show_default=True,
              help="With --replicas: this many of them only prefill prompts and hand the KV to the others, which "
                   "only decode (Dynamo's disaggregated serving).")
def serve(build_dir: Path, host: str, port: int, allow_failed_gate: bool, replicas: int | None,
          router: str | None, prefill_workers: int) -> None:
    """Serve BUILD_DIR's model with the same runtime the image runs."""
    model_dir = build_dir / "model"
    if not (model_dir / ENGINE_FILE).is_file():
        raise InputError(f"{build_dir} is not an mbuild build directory (no model/{ENGINE_FILE})",
                         hint="give the folder that `mbuild package` printed as 'build dir'")
    try:
        load_engine_config(model_dir)  # the runtime's own reading: another format stops here, not in the server
    except BundleError as exc:
        raise InputError(f"{build_dir} cannot be served: {exc}", hint="package it again with this mbuild") from exc
    warning = _gate(build_dir, allow_failed_gate)
    _check_port(host, port)
    if warning:
        click.secho(warning, fg="yellow", err=True)
    env = runtime_env(model_dir)
    if prefill_workers and (replicas is None or prefill_workers >= replicas):
        raise InputError(f"--prefill-workers {prefill_workers} leaves no worker to decode",
                         hint="give --replicas more than --prefill-workers, e.g. --replicas 2 --prefill-workers 1")
    if replicas is not None or router is not None:
        sys.exit(_replicated(model_dir, replicas or 1, router or "kv", host, port, env, prefill_workers))
    click.echo(f"serving {build_dir} on http://{host}:{port} (Ctrl+C stops)", err=True)
    # exec, not a child process: signals (Ctrl+C, SIGTERM from a supervisor) reach the server itself.
    os.execve(sys.executable, [sys.executable, "-m", "runtimes", "--host", host, "--port", str(port)], env)
