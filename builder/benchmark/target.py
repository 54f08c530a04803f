"""The thing a sweep measures, served for the run: a build directory (its runtime started here, as `mbuild serve`),
an image (run by docker or podman, its port on loopback), or a URL (already serving). Each is stopped after the
run, its log kept beside the results, and asked what it serves (/v1/metadata where it is mbuild's)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import ValidationError

from builder.benchmark.output import SERVER_LOG, TOKENIZER, Output
from builder.engine.report import REPORT_FILE, read_report
from builder.errors import BenchFailed, InputError
from builder.resources import runtime_env
from builder.serving.ready import MODELS, Outcome, Poll, wait_ready
from runtimes.api.schemas import Metadata
from runtimes.bundle import ENGINE_FILE, BundleError, DecoderOptions, EngineConfig, load_engine_config
from runtimes.health import READY
from runtimes.settings import MODEL_DIR

ENGINES = ("docker", "podman")


@dataclass(frozen=True)
class Served:
    kind: str  # build | image | url
    target: str
    url: str
    model: str
    task: str
    profile_id: str
    profile: str
    tokenizer: str  # a folder with the served model's tokenizer.json, or "builtin" (AIPerf's own)
    cores: int | None
    local: bool  # served on this host: its power is this host's
    gate: str | None = None  # a build whose numerical gate failed or never ran: its summary (its speed is measured)
    chat: bool = True  # it has a chat template (else it takes prompts on /v1/completions only)
    client_cores: tuple[int, ...] = ()  # where the load generator runs: the cores the server was not given
    context: int | None = None  # tokens a request may hold in all, where the server says (mbuild's /v1/metadata)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, api_key: str | None, timeout: float = 5) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url, timeout=timeout, headers=headers)


def _wait_ready(url: str, seconds: float, api_key: str | None, watch: Sequence[Poll], log: Path | None,
                what: str) -> None:
    """Until READY answers 200 (a server without it: /v1/models), the process lives, or time runs out."""
    where = f"its log: {log}; " if log else ""
    found = wait_ready(url, seconds, watch=watch, paths=(READY, MODELS), api_key=api_key)
    if found.outcome is Outcome.ENDED:
        raise BenchFailed(f"{what} ended before it was ready", hint=f"{where}nothing was measured")
    if found.outcome is Outcome.TIMED_OUT:
        raise BenchFailed(f"{what} was not ready within {seconds:.0f} s",
                          hint=f"{where}a larger --ready-timeout if it loads slowly; nothing was measured")


def _metadata(response: httpx.Response) -> Metadata | None:
    """mbuild's /v1/metadata; None from a server without it, or whose route of that name is another's (NIM's)."""
    if response.status_code != 200:
        return None
    try:
        return Metadata.model_validate_json(response.content)
    except ValidationError:
        return None


def _served(meta: Metadata, engine: EngineConfig, kind: str, target: str, url: str, tokenizer: str,
            cores: int | None, local: bool) -> Served:
    profile = meta.profile
    return Served(kind, target, url, meta.name, engine.task, profile.id if profile else "",
                  profile.name if profile else "", tokenizer, cores, local,
                  chat=isinstance(engine.options, DecoderOptions) and bool(engine.options.chat_template),
                  context=engine.max_seq_length)


def describe(kind: str, target: str, url: str, api_key: str | None, tokenizer: str, cores: int | None,
             local: bool) -> Served:
    """What the server says it serves: mbuild's /v1/metadata, else the first of /v1/models (task from --task)."""
    try:
        meta = _metadata(_get(f"{url}/v1/metadata", api_key))
        if meta is not None and meta.engine is not None:
            return _served(meta, meta.engine, kind, target, url, tokenizer, cores, local)
        listed = _get(f"{url}/v1/models", api_key)
    except httpx.HTTPError as exc:
        raise BenchFailed(f"cannot reach {url}: {exc}", hint="check the URL and that the server is up; nothing "
                          "was measured") from exc
    if listed.status_code in (401, 403):
        raise BenchFailed(f"{url} refused the request ({listed.status_code})", hint="give its key with --api-key")
    try:
        name = str(listed.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchFailed(f"{url}/v1/models does not list a model (status {listed.status_code})",
                          hint="give the URL of an OpenAI-compatible server") from exc
    return Served(kind, target, url, name, "text-generation", "", "", tokenizer, cores, local)


def split_cores(cores: int | None) -> tuple[list[int], tuple[int, ...]]:
    """(the server's, the load generator's): the last --cores of this process's, the rest for AIPerf so the two do
    not share a core; without --cores the server has all of them and AIPerf runs beside it."""
    mine = sorted(os.sched_getaffinity(0))
    if cores is not None and cores > len(mine):
        raise InputError(f"--cores {cores}: this process may use {len(mine)} cores", hint=f"give at most {len(mine)}")
    if not cores:
        return mine, ()
    return mine[-cores:], tuple(mine[:-cores])


def build_engine(build_dir: Path) -> EngineConfig:
    """A build directory's engine.json: its task and context, read before it is served."""
    hint = "give the folder `mbuild package` printed as 'build dir', an image or a URL"
    if not (build_dir / "model" / ENGINE_FILE).is_file():
        raise InputError(f"{build_dir} is not an mbuild build directory (no model/{ENGINE_FILE})", hint=hint)
    try:
        return load_engine_config(build_dir / "model")
    except BundleError as exc:
        raise InputError(f"{build_dir} is not a build `mbuild bench` can run: {exc}", hint=hint) from exc


@contextmanager
def _build(build_dir: Path, out: Output, cores: int | None, ready_s: float) -> Iterator[Served]:
    build_engine(build_dir)
    share, client = split_cores(cores)
    port = _free_port()
    env = runtime_env(build_dir / "model", MBUILD_THREADS=str(len(share)))
    log = out.path(SERVER_LOG)
    with log.open("w") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "runtimes", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, share))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, ready_s, None, [proc.poll], log, f"the server of {build_dir}")
        found = describe("build", str(build_dir), url, None, str((build_dir / "model").resolve()), len(share), True)
        # a passed gate's report is in model/; a failed build leaves its report beside model/
        report = read_report(build_dir / "model" / REPORT_FILE) or read_report(build_dir / REPORT_FILE)
        gate = None if report is not None and report.passed else (
            report.summary if report else "never validated")
        yield dataclasses.replace(found, client_cores=client, gate=gate)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_engine(image: str, engine: str | None) -> str:
    """The container engine holding image; none is the user's mistake (a typo, or a build directory's path)."""
    chosen = [engine] if engine else [e for e in ENGINES if shutil.which(e)]
    for tool in chosen:
        if shutil.which(tool) and subprocess.run([tool, "image", "inspect", image], capture_output=True,
                                                 timeout=60, check=False).returncode == 0:
            return tool
    raise InputError(f"{image} is not a build directory, a URL or an image {' or '.join(chosen) or 'docker'} holds",
                     hint="give a build directory, http(s)://HOST:PORT, or an image `docker images` lists "
                          "(`mbuild load` puts a pushed one there)")


@contextmanager
def _image(image: str, out: Output, cores: int | None, ready_s: float, engine: str | None) -> Iterator[Served]:
    tool = image_engine(image, engine)
    share, client = split_cores(cores)
    port = _free_port()
    # The host's network, the server on loopback: hosts without a bridge (rootless, CI) run it the same way.
    run = [tool, "run", "-d", "--network", "host", "-e", "MBUILD_HOST=127.0.0.1", "-e", f"MBUILD_PORT={port}",
           "--cpuset-cpus", ",".join(map(str, share)), "-e", f"MBUILD_THREADS={len(share)}", image]
    started = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    if started.returncode != 0:
        raise BenchFailed(f"{tool} could not run {image}: {started.stderr.strip()[-400:]}",
                          hint=f"try `{' '.join(run)}` by hand")
    container = started.stdout.strip()
    log = out.path(SERVER_LOG)

    def exited() -> int | None:
        """The container's exit status once it has stopped (1 where the engine does not say)."""
        state = subprocess.run([tool, "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", container],
                               capture_output=True, text=True, timeout=30, check=False)
        running, _, code = state.stdout.strip().partition(" ")
        return None if running == "true" else int(code) if code.isdigit() else 1
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, ready_s, None, [exited], log, f"the container of {image}")
        tokenizer = out.path(TOKENIZER)
        tokenizer.mkdir(exist_ok=True)
        copied = subprocess.run([tool, "cp", f"{container}:{MODEL_DIR}/tokenizer.json", str(tokenizer)],
                                capture_output=True, timeout=60, check=False).returncode == 0
        found = describe("image", image, url, None, str(tokenizer) if copied else "builtin", len(share), True)
        yield dataclasses.replace(found, client_cores=client)
    finally:
        with log.open("w") as handle:
            subprocess.run([tool, "logs", container], stdout=handle, stderr=subprocess.STDOUT, timeout=60, check=False)
        subprocess.run([tool, "rm", "-f", container], capture_output=True, timeout=60, check=False)


@contextmanager
def serving(target: str, out: Output, *, cores: int | None = None, ready_s: float = 300, engine: str | None = None,
            api_key: str | None = None, tokenizer: str | None = None) -> Iterator[Served]:
    if target.startswith(("http://", "https://")):
        url = target.rstrip("/")
        served = describe("url", target, url, api_key, tokenizer or "builtin", cores, False)  # reachable at all
        _wait_ready(url, ready_s, api_key, (), None, f"the server at {url}")
        yield served
    elif Path(target).is_dir():
        with _build(Path(target), out, cores, ready_s) as served:
            yield served
    else:
        with _image(target, out, cores, ready_s, engine) as served:
            yield served
