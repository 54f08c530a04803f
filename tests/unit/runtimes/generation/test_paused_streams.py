"""Twelve streams whose clients never read, through the real app and loop (the scripted engine in the graph's
place): the server stops generating for them, holds their slots and their bounded events, and each ends whole once
read. The ASGI `send` is where a client that does not read makes the server wait (its transport's write buffer is
full), so the test makes send wait; over real sockets the kernel's buffers (up to tcp_wmem's 4 MiB a socket here)
would take this model's whole output first, hiding what the process itself holds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio

from runtimes.generation.rows import MAX_UNREAD, RowStatus
from tests.support.scripted_model import byte_level_tokenizer, serving_scripted, write_bundle

STREAMS, TOKENS = 12, 1000


def test_twelve_streams_that_never_read_hold_their_slots_and_bounded_memory_and_resume_when_read(
        tmp_path: Path) -> None:
    tokenizer = byte_level_tokenizer([], ["<|endoftext|>"])
    end = tokenizer.token_to_id("<|endoftext|>")
    assert end is not None
    folder = write_bundle(tmp_path / "bundle", tokenizer.to_str(), tokenizer.get_vocab_size(), "", (end,),
                          {"eos_token": "<|endoftext|>"})
    body = json.dumps({"model": "m", "prompt": "Hello there", "max_tokens": TOKENS, "logprobs": 5, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    with serving_scripted(folder, served_name="m", max_batch=STREAMS) as (client, engine):
        engine.marker = tuple(tokenizer.encode("Hello there").ids)
        engine.reply = tokenizer.encode("the quick brown fox " * 400).ids[:TOKENS]
        loop = client.app.state.service.generation.engine_loop  # type: ignore[attr-defined]
        portal = client.portal
        assert portal is not None
        resume = portal.call(_event)
        outputs: list[list[dict[str, Any]]] = [[] for _ in range(STREAMS)]
        futures = [portal.start_task_soon(_unread_stream, client.app, body, resume, out) for out in outputs]

        made, deadline = -1, time.monotonic() + 30
        while (now := _completion_tokens(loop)) != made and time.monotonic() < deadline:
            made = now
            time.sleep(0.5)  # until the server stops making tokens
        rows = loop.scheduler.rows
        print(f"paused at {made} of {STREAMS * TOKENS} tokens; unread events {[r.request.unread for r in rows]}")
        assert len(rows) == STREAMS and all(row.status is RowStatus.PAUSED for row in rows)  # each holds its slot
        assert made < STREAMS * TOKENS // 4  # paused long before the end
        assert all(row.request.unread <= MAX_UNREAD for row in rows)  # the bound: MAX_UNREAD events a stream
        assert not loop.scheduler.plan_step()  # and nothing is planned for them

        portal.call(resume.set)
        for future in futures:
            future.result(timeout=60)
        for out in outputs:
            chunks = [json.loads(m["body"][6:]) for m in out
                      if m["type"] == "http.response.body" and m["body"].startswith(b"data: {")]
            usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
            text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
            assert usage[-1]["completion_tokens"] == TOKENS and text == tokenizer.decode(engine.reply)


async def _event() -> anyio.Event:
    return anyio.Event()


def _completion_tokens(loop: Any) -> int:
    return sum(len(row.sampler.generated) for row in loop.scheduler.rows)


async def _unread_stream(app: Any, body: bytes, resume: anyio.Event, out: list[dict[str, Any]]) -> None:
    """One POST whose client takes the response's start and first piece, then nothing until `resume`."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"host", b"testserver")],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80), "scheme": "http"}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()  # the client never goes away
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        out.append(message)
        if message["type"] == "http.response.body" and len(out) >= 3:
            await resume.wait()  # a full write buffer: the server waits here until the client reads

    with anyio.move_on_after(90):
        await app(scope, receive, send)
