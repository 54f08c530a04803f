"""Issue 13, "Done when" 2 and 3: hostile input, slow and abandoned clients, and abandoned work.

The tiny encoder, Llama and cross-encoder are served on loopback with `mbuild serve` (MBUILD_API_KEY set, an
8 MiB body limit so oversized lists reach the parser). While the corpora of tests/support/hostile_cases.py and
hostile_rerank_cases.py run, "innocent" clients stream chat completions, ask for embeddings and rerank; each one
that does not complete correctly is a request lost. Run with `pytest -s` to see the report lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.corpus import AUTH, KEY, Case, check, send, served_model, server_rss
from tests.support.hostile_cases import ENCODER_CASES, LLM_CASES, MSG
from tests.support.hostile_rerank_cases import RERANK_CASES
from tests.support.procs import served

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ENV = {"MBUILD_API_KEY": KEY, "MBUILD_MAX_QUEUE": "8", "MBUILD_MAX_BODY_BYTES": str(8 << 20),
       "MBUILD_REQUEST_TIMEOUT": "20"}
CASE_TIMEOUT = 30.0  # a case with no answer by then counts as a hang
EMBED: tuple[str, dict[str, Any]] = ("/v1/embeddings", {"input": "a normal request"})
CHAT: tuple[str, dict[str, Any]] = ("/v1/chat/completions", {"messages": MSG, "max_tokens": 4})
RERANK: tuple[str, dict[str, Any]] = ("/v1/rerank", {"query": "fox", "documents": ["the quick dog", "python"]})
LONG = "a long sentence about containers, health checks and batching " * 40


@dataclass(frozen=True)
class Server:
    url: str
    log: Path

    def log_size(self) -> int:
        return self.log.stat().st_size

    def traceback_since(self, offset: int) -> str:
        with self.log.open("rb") as handle:
            handle.seek(offset)
            new = handle.read().decode("utf-8", "replace")
        raised = re.findall(r"^(?![\d\s]|Traceback|The above|During)(\S+: .*)$", new, re.M)
        return " | ".join(dict.fromkeys(raised))[-400:] if "Traceback" in new else ""


def _serve(build: Path) -> Iterator[Server]:
    with served(build, env=ENV) as url:
        yield Server(url, build / f"serve-{url.rsplit(':', 1)[1]}.log")


@pytest.fixture(scope="module")
def encoder(tiny_build: Path) -> Iterator[Server]:
    yield from _serve(tiny_build)


@pytest.fixture(scope="module")
def llm(tiny_llm_build: Path) -> Iterator[Server]:
    yield from _serve(tiny_llm_build)


@pytest.fixture(scope="module")
def reranker(tiny_rerank_build: Path) -> Iterator[Server]:
    yield from _serve(tiny_rerank_build)


class Innocents:
    """Other clients: streaming chats, embeddings and reranks in a loop (bounded), each checked for a correct
    answer."""

    def __init__(self, encoder_url: str, llm_url: str, rerank_url: str, each: int = 2, seconds: float = 1200) -> None:
        self.encoder_url, self.llm_url, self.rerank_url, self.each = encoder_url, llm_url, rerank_url, each
        self.deadline = time.monotonic() + seconds
        self.stop, self.done, self.streaming = threading.Event(), 0, 0
        self.lost: list[str] = []
        self.current = "(before the corpus)"
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Innocents:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self._thread.join(timeout=120)

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=CASE_TIMEOUT) as client:
            await asyncio.gather(*[self._loop(client, one)
                                   for one in (self._chat, self._embed, self._rerank) * self.each])

    async def _loop(self, client: httpx.AsyncClient, one: Any) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            await asyncio.sleep(0.02)  # a steady trickle, not a flood
            during = self.current
            try:
                problem = await asyncio.wait_for(one(client), CASE_TIMEOUT + 10)
            except (TimeoutError, httpx.HTTPError, ValueError, KeyError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            self.done += 1
            if problem:
                self.lost.append(f"{one.__name__[1:]} during [{during}] .. [{self.current}]: {problem}"[:400])

    async def _chat(self, client: httpx.AsyncClient) -> str | None:
        body = {"messages": MSG, "max_tokens": 24, "ignore_eos": True, "stream": True}
        events: list[str] = []
        async with client.stream("POST", f"{self.llm_url}/v1/chat/completions", json=body, headers=AUTH) as got:
            if got.status_code != 200:
                return f"status {got.status_code}: {(await got.aread())[:200]!r}"
            self.streaming += 1
            try:
                events = [line[6:] async for line in got.aiter_lines() if line.startswith("data: ")]
            finally:
                self.streaming -= 1
        if not events or events[-1] != "[DONE]":
            return f"the stream ended without [DONE] after {len(events)} events: {events[-1:]}"
        chunks = [json.loads(e) for e in events[:-1]]
        finish = [c["finish_reason"] for chunk in chunks for c in chunk.get("choices", []) if c.get("finish_reason")]
        return None if finish == ["length"] else f"finish reasons {finish}, last event {events[-2][:200]}"

    async def _embed(self, client: httpx.AsyncClient) -> str | None:
        got = await client.post(f"{self.encoder_url}/v1/embeddings", json={"input": ["one", "two"]}, headers=AUTH)
        data = got.json().get("data") if got.status_code == 200 else None
        ok = data and len(data) == 2 and all(len(d["embedding"]) > 0 for d in data)
        return None if ok else f"status {got.status_code}: {got.text[:200]}"

    async def _rerank(self, client: httpx.AsyncClient) -> str | None:
        got = await client.post(self.rerank_url + RERANK[0], json=RERANK[1], headers=AUTH)
        results = got.json().get("results") if got.status_code == 200 else None
        ok = results and sorted(r["index"] for r in results) == [0, 1]
        return None if ok else f"status {got.status_code}: {got.text[:200]}"

    def wait_streaming(self, seconds: float = 3.0) -> None:
        deadline = time.monotonic() + seconds
        while self.streaming < 1 and time.monotonic() < deadline:
            time.sleep(0.01)


def run_cases(server: Server, cases: list[Case], normal: tuple[str, dict[str, Any]], innocents: Innocents,
              counts: Counter[str], failures: list[str], grown: dict[str, int]) -> None:
    with httpx.Client() as client:
        model = served_model(client, server.url)
    last_rss = server_rss(server.url)
    for case in cases:
        innocents.current = case.name
        if server.url == innocents.llm_url:
            innocents.wait_streaming()  # so the case meets running streams
        offset, counts["cases"] = server.log_size(), counts["cases"] + 1
        with httpx.Client() as client:  # a connection of its own: a case may end it
            try:
                got = send(client, server.url, case, model, timeout=CASE_TIMEOUT)
                problem = check(case, got)
                counts["5xx"] += got.status_code >= 500
            except httpx.HTTPError as exc:
                problem, counts["no answer"] = f"no answer: {type(exc).__name__} {exc}", counts["no answer"] + 1
        with httpx.Client(timeout=CASE_TIMEOUT) as client:
            ready = client.get(f"{server.url}/v1/health/ready").status_code
            after = client.post(server.url + normal[0], json=normal[1], headers=AUTH).status_code
        if ready != 200 or after != 200:
            problem = f"{problem or ''}; then ready {ready}, a normal request {after}"
        rss = server_rss(server.url)
        grown[case.name], last_rss = rss - last_rss, rss
        if problem:
            trace = server.traceback_since(offset)
            failures.append(f"{case.name}: {problem}" + (f"\n      server log: {trace}" if trace else ""))


def test_hostile_corpus(encoder: Server, llm: Server, reranker: Server) -> None:
    counts: Counter[str] = Counter()
    failures: list[str] = []
    grown: dict[str, int] = {}  # case -> how much its server's memory grew over it
    servers = (encoder, llm, reranker)
    with Innocents(encoder.url, llm.url, reranker.url) as innocents:
        time.sleep(3)  # warm: every code path the innocents use has run
        rss_before = sum(server_rss(s.url) for s in servers)
        run_cases(encoder, ENCODER_CASES, EMBED, innocents, counts, failures, grown)
        run_cases(llm, LLM_CASES, CHAT, innocents, counts, failures, grown)
        run_cases(reranker, RERANK_CASES, RERANK, innocents, counts, failures, grown)
        innocents.current = "(after the corpus)"
    time.sleep(5)  # settle
    rss_after = sum(server_rss(s.url) for s in servers)
    print(f"\nhostile corpus: {counts['cases']} cases tried, 5xx: {counts['5xx']}, "
          f"other clients' requests lost: {len(innocents.lost)} (of {innocents.done}), "
          f"rss before/after: {rss_before / 1e6:.0f} -> {rss_after / 1e6:.0f} MB")
    print(f"no answer within {CASE_TIMEOUT:g} s: {counts['no answer']}; failing cases: {len(failures)}")
    top = sorted(grown.items(), key=lambda item: -item[1])[:5]
    print("rss grew most over: " + ", ".join(f"{name} (+{size / 1e6:.0f} MB)" for name, size in top))
    print("".join(f"  FAIL {f}\n" for f in failures) + "".join(f"  LOST {lost}\n" for lost in innocents.lost))
    assert counts["cases"] >= 100 and innocents.done > 0
    assert counts["5xx"] == 0 and not innocents.lost and not failures
    # The first pass may raise the high-water mark (the allocators keep freed pages, the grammar cache keeps what it
    # compiled), so it is held to a ceiling; a leak is growth on repetition, which the replay measures.
    assert rss_after <= 1.25 * rss_before
    # A leak is growth on every repetition; the allocators' high-water mark jumps now and then (CI runs have read
    # 571 -> 595 MB on a first replay and 558 -> 583 on a second, and replaying one case alone plateaus after a few
    # rounds). So the five cases that grew most are replayed five times, and the step between replays that three of
    # the four steps reach is held to 1%: one or two jumps pass, while a leak shows in every step and fails (25
    # requests a replay: about 220 KB a request if every case leaks, about 1.1 MB if one case does).
    names = [name for name, _ in top]
    replays = [_replay(names, servers) for _ in range(5)]
    steps = [after - before for before, after in itertools.pairwise(replays)]
    print(f"replaying the 5 that grew most 5 times, five times: {rss_after / 1e6:.0f} -> "
          + " -> ".join(f"{size / 1e6:.0f}" for size in replays) + " MB")
    assert replays[0] <= 1.1 * rss_after and statistics.median_low(steps) <= 0.01 * replays[0]


def _replay(names: list[str], servers: tuple[Server, Server, Server]) -> int:
    """Sends the named cases five more times each; returns the servers' memory after."""
    by_name = {c.name: (server, c) for server, cases in zip(servers, (ENCODER_CASES, LLM_CASES, RERANK_CASES),
                                                             strict=True) for c in cases}
    for _ in range(5):
        for name in names:
            server, case = by_name[name]
            with httpx.Client() as client, contextlib.suppress(httpx.HTTPError):  # a case may end its connection
                send(client, server.url, case, served_model(client, server.url), timeout=CASE_TIMEOUT)
    time.sleep(5)  # settle, as after the corpus
    return sum(server_rss(s.url) for s in servers)


def _normal_ok(url: str, normal: tuple[str, dict[str, Any]], client: httpx.Client | None = None) -> float:
    started = time.perf_counter()
    got = (client or httpx).post(url + normal[0], json=normal[1], headers=AUTH, timeout=CASE_TIMEOUT)
    took = time.perf_counter() - started
    assert got.status_code == 200 and "error" not in got.json(), got.text[:300]
    return took


def _raw(url: str, head: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head.encode() + body)
    return sock


def _post_head(path: str, length: int) -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n")


def _running(url: str) -> float:
    text = httpx.get(f"{url}/v1/metrics", headers=AUTH, timeout=10).text
    found = re.search(r"^mbuild_running_sequences(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _context(url: str) -> int:
    return int(httpx.get(f"{url}/v1/metadata", headers=AUTH, timeout=10).json()["engine"]["max_seq_length"])


def test_slow_and_abandoned_clients(encoder: Server, llm: Server) -> None:
    for server, normal in ((encoder, EMBED), (llm, CHAT)):  # 20 clients send headers and stall their bodies
        stalled = [_raw(server.url, _post_head(normal[0], 1000), b'{"input": "') for _ in range(20)]
        assert _normal_ok(server.url, normal) < 5, "slow clients hold up the others"
        time.sleep(2)
        assert _normal_ok(server.url, normal) < 5
        for sock in stalled:
            sock.close()
        _normal_ok(server.url, normal)
    room = _context(llm.url) - 4
    long_stream = {"prompt": [5, 6, 7, 8], "max_tokens": room, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{llm.url}/v1/completions", json=long_stream, headers=AUTH, timeout=30) as got:
        assert got.status_code == 200
        next(line for line in got.iter_lines() if line.startswith("data: "))  # one event, then gone
    deadline = time.monotonic() + 2
    while _running(llm.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(llm.url) == 0, "a stream whose client left is still generating after 2 s"
    _normal_ok(llm.url, CHAT)
    huge = [(encoder, "/v1/embeddings", {"input": [LONG] * 2048, "truncate": "END"}, EMBED),
            (llm, "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": room, "ignore_eos": True}, CHAT)]
    for server, path, body, normal in huge:  # a huge legal request, then the client leaves at once
        data = json.dumps(body).encode()
        _raw(server.url, _post_head(path, len(data)), data).close()
        _normal_ok(server.url, normal)


SETTLE = 1.0  # seconds idle before the unloaded timing


@pytest.mark.parametrize("which", ["encoder", "llm"])
def test_abandoned_work_is_dropped(which: str, encoder: Server, llm: Server) -> None:
    """50 maximal requests sent in full and abandoned: the server is back to its unloaded latency in a few
    heavy requests' time, where doing them would take at least the queue's 8. Measured against one heavy request
    on this machine, not a fixed settle (a CI machine once needed more than 1 s for the dropped remnants)."""
    server, normal = (encoder, EMBED) if which == "encoder" else (llm, CHAT)
    heavy = ("/v1/embeddings", {"input": [LONG[:200]] * 2048, "truncate": "END"}) if which == "encoder" else (
        "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": _context(llm.url) - 4, "ignore_eos": True})
    with httpx.Client() as timer:  # one warm connection, so only the server's time is measured (closed on failure)
        _normal_ok(server.url, normal, timer)
        # A request after a second idle is slower than one right after another (5-30 ms against 5-9 here), so
        # the unloaded side waits too and takes the median of three.
        time.sleep(SETTLE)
        unloaded = statistics.median(_normal_ok(server.url, normal, timer) for _ in range(3))
        one_heavy = _normal_ok(server.url, heavy, timer)  # what one abandoned request would cost if it ran
        data = json.dumps(heavy[1]).encode()
        offset = server.log_size()
        clients = [_raw(server.url, _post_head(heavy[0], len(data)), data) for _ in range(50)]  # all sent in full
        time.sleep(0.05)
        for sock in clients:  # and all gone ~50 ms later
            sock.close()
        left = time.perf_counter()
        at_once = _normal_ok(server.url, normal, timer)
        latency, recovered = at_once, time.perf_counter() - left
        while latency > 2 * unloaded + 0.01 and recovered < 50 * one_heavy:  # polled until unloaded again
            time.sleep(0.1)
            latency = statistics.median(_normal_ok(server.url, normal, timer) for _ in range(3))
            recovered = time.perf_counter() - left
    with server.log.open("rb") as handle:  # the access log: the abandoned requests the handler took up
        handle.seek(offset)
        reached = Counter(re.findall(rf"POST {heavy[0]} (\d+)", handle.read().decode("utf-8", "replace")))
    print(f"\nabandoned work ({which}): unloaded {unloaded * 1000:.1f} ms, one heavy request {one_heavy:.2f} s; "
          f"after 50 abandoned: {at_once * 1000:.1f} ms at once, back to {latency * 1000:.1f} ms after "
          f"{recovered:.2f} s; statuses in the server's access log {dict(reached)}")
    assert latency <= 2 * unloaded + 0.01, "abandoned requests still hold the engine"
    assert recovered < 4 * one_heavy + SETTLE, "the abandoned requests' work was done, not dropped"
