"""One wait for a started server (builder/serving/ready.py), and what each caller makes of it: it says whether the
server came up, a watched process ended (which, with what status) or time ran out, against a real HTTP server on
loopback and real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.lib import servers
from builder.benchmark.target import _wait_ready
from builder.errors import BenchFailed, MbuildError
from builder.serving.ready import MODELS, Outcome, lists_model, wait_ready
from builder.serving.replicas import _ready
from runtimes.health import READY

Route = Callable[[int, str], tuple[int, object]]  # (how many times asked, Authorization) -> (status, JSON body)


@pytest.fixture
def routes() -> Iterator[tuple[str, dict[str, Route]]]:
    """A server on loopback answering what `routes` says for each path (404 for any other)."""
    table: dict[str, Route] = {}
    asked: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked[self.path] = asked.get(self.path, 0) + 1
            route = table.get(self.path)
            status, body = route(asked[self.path], self.headers.get("Authorization", "")) if route else (404, {})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", table
    finally:
        server.shutdown()
        server.server_close()


def closed_url() -> str:
    """A loopback URL nothing listens on."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.server_close()
    return f"http://127.0.0.1:{server.server_address[1]}"


def exits(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def test_ready_once_the_route_answers_200(routes: tuple[str, dict[str, Route]]) -> None:
    url, table = routes
    table[READY] = lambda n, _: (200, {}) if n >= 3 else (503, {"status": "loading"})
    assert wait_ready(url, 10, every_s=0.01).outcome is Outcome.READY


def test_a_watched_process_that_ends_is_named_with_its_status() -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = wait_ready(closed_url(), 10, watch=[alive.poll, exits(3).poll], every_s=0.01)
    finally:
        alive.kill()
        alive.wait()
    assert (found.outcome, found.ended, found.returncode) == (Outcome.ENDED, 1, 3)


def test_time_runs_out_while_the_server_is_not_ready(routes: tuple[str, dict[str, Route]]) -> None:
    url, table = routes
    table[READY] = lambda n, _: (503, {"status": "loading"})
    assert wait_ready(url, 0.3, every_s=0.01).outcome is Outcome.TIMED_OUT
    assert wait_ready(closed_url(), 0.3, every_s=0.01).outcome is Outcome.TIMED_OUT


def test_the_first_path_the_server_has_decides(routes: tuple[str, dict[str, Route]]) -> None:
    """A server without READY (a 404) is asked the next path; one that has it and says 503 is not ready."""
    url, table = routes
    table[MODELS] = lambda n, _: (200, {"data": []})
    assert wait_ready(url, 5, paths=(READY, MODELS), every_s=0.01).outcome is Outcome.READY
    table[READY] = lambda n, _: (503, {})
    assert wait_ready(url, 0.3, paths=(READY, MODELS), every_s=0.01).outcome is Outcome.TIMED_OUT


def test_the_api_key_goes_with_each_request(routes: tuple[str, dict[str, Route]]) -> None:
    url, table = routes
    table[READY] = lambda n, auth: (200, {}) if auth == "Bearer s3cret" else (401, {})
    assert wait_ready(url, 0.3, every_s=0.01).outcome is Outcome.TIMED_OUT
    assert wait_ready(url, 5, api_key="s3cret", every_s=0.01).outcome is Outcome.READY


def test_a_model_list_is_ready_once_it_holds_the_model(routes: tuple[str, dict[str, Route]]) -> None:
    url, table = routes
    table[MODELS] = lambda n, _: (200, {"data": [{"id": "other"}] if n < 3 else [{"id": "other"}, {"id": "m"}]})
    assert wait_ready(url, 5, paths=(MODELS,), check=lists_model("m"), every_s=0.01).outcome is Outcome.READY
    table[MODELS] = lambda n, _: (200, {"data": []} if n < 2 else ["not", "models"])
    assert wait_ready(url, 0.3, paths=(MODELS,), check=lists_model(), every_s=0.01).outcome is Outcome.TIMED_OUT


def test_each_caller_says_what_it_always_said(tmp_path: Path) -> None:
    """mbuild bench, mbuild serve --replicas and the benchmarks' server() keep their own errors."""
    ended = exits(7)
    with pytest.raises(BenchFailed, match="the server of x ended before it was ready"):
        _wait_ready(closed_url(), 10, None, [ended.poll], tmp_path / "log", "the server of x")
    with pytest.raises(BenchFailed, match="the server at y was not ready within 0 s"):
        _wait_ready(closed_url(), 0.2, None, (), None, "the server at y")
    with pytest.raises(MbuildError, match=r"a serving process ended while starting \(exit 7\)"):
        _ready(closed_url(), "m", [ended], None)
    with pytest.raises(RuntimeError, match="exited with 5"), \
            servers.server([sys.executable, "-c", "raise SystemExit(5)"], READY, 9):
        pass
