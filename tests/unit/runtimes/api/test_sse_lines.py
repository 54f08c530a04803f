"""Server-sent events whose JSON holds the characters Python's str.splitlines ends a line at (U+0085, U+2028,
U+2029; a token may decode to one): mbuild's events escape them, so httpx's aiter_lines reads each event whole; and
the benchmarks' client reads a peer that sends them raw (llama.cpp does) by SSE's own line ends."""

from __future__ import annotations

import asyncio
import json

import httpx

from bench.lib.llm_client import sse_data, sse_lines
from runtimes.api.completions import sse_event

TEXT = "a\u2028b\x85c\u2029d é"


def test_mbuild_events_read_whole_through_httpx_lines() -> None:
    event = sse_event({"choices": [{"text": TEXT}]})
    lines = [line for line in event.decode().splitlines() if line]
    assert len(lines) == 1 and json.loads(lines[0][len("data: "):])["choices"][0]["text"] == TEXT
    assert "é" in lines[0]  # only the line breakers are escaped


def test_the_bench_client_reads_raw_line_breakers_inside_an_event() -> None:
    raw = ("data: " + json.dumps({"text": TEXT}, ensure_ascii=False) + "\r\n\r\ndata: [DONE]\n\n").encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=httpx.ByteStream(raw))

    async def read() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client, \
                client.stream("GET", "http://peer/") as response:
            return [line async for line in sse_lines(response)]

    lines = asyncio.run(read())
    assert [sse_data(line) for line in lines if line] == [{"text": TEXT}, None]
