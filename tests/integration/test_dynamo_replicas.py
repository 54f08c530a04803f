"""`mbuild serve BUILD --replicas 2 --router kv`: the tiny Llama's build as two Dynamo workers behind Dynamo's real
frontend and KV router (real processes, file discovery, TCP and ZMQ), with MBUILD_API_KEY set, driven with the openai
SDK: chat, completions, streaming, a stream dropped mid-way, a json_schema answer, a refused field; a repeated long
prompt routed to the worker whose prefix cache holds it, as the router's own metrics count it; hostile fields, each a
400; and prefill and decode on different workers, the prompt's KV moved between them. Every route but the health
probes asks for the key, admin routes too, and nothing listens beyond --host."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import psutil
import pytest

from tests.support.procs import served

pytestmark = pytest.mark.slow
pytest.importorskip("dynamo.frontend", reason="the dynamo extra is not installed (tests/run.sh installs it)")
NAME = "tiny"
KEY = "replicas-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENV = {"MBUILD_SERVED_MODEL_NAME": NAME, "MBUILD_API_KEY": KEY}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["name", "count"], "additionalProperties": False}


@pytest.fixture(scope="module")
def frontend(tiny_llm_build: Path) -> Iterator[str]:
    with served(tiny_llm_build, ENV, args=("--replicas", "2", "--router", "kv"), ready="/health") as url:
        _registered(url)
        yield url


def _registered(url: str) -> None:
    deadline = time.monotonic() + 180
    while not any(m["id"] == NAME for m in httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"]):
        assert time.monotonic() < deadline, "the workers never registered the model"
        time.sleep(0.5)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_chat_completions_and_streams_through_the_frontend(frontend: str) -> None:
    api = client(frontend)
    chat = api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       temperature=0)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 8
    done = api.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=6, temperature=0)
    assert done.choices[0].text and done.choices[0].finish_reason == "length"
    pieces = [c.choices[0].delta.content or "" for c in api.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0, stream=True)
        if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content  # streamed or whole, the same greedy answer
    logprobs = api.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=3, temperature=0,
                                      logprobs=2).choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs and all(v <= 0 for v in logprobs.token_logprobs)


def test_a_dropped_stream_leaves_the_service_serving(frontend: str) -> None:
    api = client(frontend)
    stream = api.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=900, temperature=0,
                                    stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    again = api.completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0)
    assert again.choices[0].text


def test_a_json_schema_answer_and_a_refused_field(frontend: str) -> None:
    api = client(frontend)
    answer = api.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Give a name and a count."}], max_tokens=60,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}})
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    with pytest.raises(openai.BadRequestError, match="min_p"):
        api.completions.create(model=NAME, prompt="Hello", max_tokens=4, extra_body={"min_p": 0.5})


def _selected_cached(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    return sum(float(v) for v in re.findall(r"^dynamo_component_router_kv_selected_cached_prefix_tokens_total\{.*\} "
                                            r"(\S+)$", text, re.M))


def test_a_repeated_prefix_goes_to_the_worker_that_holds_it(frontend: str) -> None:
    api = client(frontend)
    document = "Containers package software with everything it needs. " * 12
    before = _selected_cached(frontend)
    for question in ("What is it?", "Say it again.", "Once more."):
        api.chat.completions.create(model=NAME, messages=[{"role": "system", "content": document},
                                                          {"role": "user", "content": question}],
                                    max_tokens=4, temperature=0)
        time.sleep(0.3)  # the worker publishes its stored blocks every 50 ms
    assert _selected_cached(frontend) - before >= 2 * 64  # the later turns were sent where the document was cached


def test_prefill_and_decode_apart_answer_as_one_worker_does(frontend: str, tiny_llm_build: Path) -> None:
    """`--replicas 2 --prefill-workers 1`: Dynamo's frontend sends each prompt to the prefill worker, then to the
    decode worker, which takes the prompt's KV from it (runtimes/dynamo/kv_transfer.py) instead of prefilling it;
    greedy answers, whole and streamed, are the aggregated replicas' own."""
    messages: Any = [{"role": "system", "content": "Containers package software with everything it needs. " * 6},
                     {"role": "user", "content": "What is it?"}]
    want = client(frontend).chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
    with served(tiny_llm_build, ENV, ready="/health",
                args=("--replicas", "2", "--prefill-workers", "1")) as url:
        _registered(url)
        api = client(url)
        got = api.chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage is not None and got.usage.completion_tokens == 12
        streamed = "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(
            model=NAME, messages=[*messages[:1], {"role": "user", "content": "And then?"}], max_tokens=8,
            temperature=0, stream=True) if c.choices)
        assert streamed
        log = (tiny_llm_build / f"serve-{url.rsplit(':', 1)[1]}.log").read_text(errors="replace")
    moved = [int(n) for n in re.findall(r"took the KV of (\d+) of \d+ prompt tokens", log)]
    assert len(moved) == 2 and all(n >= 64 for n in moved), log[-2000:]  # both prompts' KV came over
    assert "prefilling it here" not in log


HOSTILE: dict[str, dict[str, Any]] = {  # chat fields past what the frontend or the worker takes: each a 400
    "max_tokens past any context": {"max_tokens": 10 ** 12}, "a negative max_tokens": {"max_tokens": -1},
    "temperature NaN": {"temperature": float("nan")}, "temperature below 0": {"temperature": -1},
    "top_p above 1": {"top_p": 2}, "n of 5": {"n": 5}, "min_p": {"min_p": 0.3},
    "1000 top logprobs": {"logprobs": True, "top_logprobs": 1000}, "a seed past 64 bits": {"seed": 2 ** 70},
    "10k stop strings": {"stop": ["x"] * 10_000}, "100k stop ids": {"stop_token_ids": list(range(100_000))},
    "a broken pattern": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(((("}}}},
    "min_tokens above max_tokens": {"min_tokens": 50, "max_tokens": 5}, "ignore_eos as text": {"ignore_eos": "yes"},
    "no messages": {"messages": []}, "a prompt past the context": {"messages": [{"role": "user",
                                                                                "content": "w " * 50_000}]},
}


def test_hostile_fields_through_the_frontend_are_400s_and_lose_nothing(frontend: str) -> None:
    """Each refused with a 400 by Dynamo's frontend or by the worker's mapping (runtimes/dynamo/requests.py), none
    a 5xx or a hang; the service answers a normal request after each."""
    for name, extra in HOSTILE.items():
        body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra},
                          allow_nan=True)
        got = httpx.post(f"{frontend}/v1/chat/completions", content=body, timeout=30,
                         headers={"content-type": "application/json", **AUTH})
        assert got.status_code == 400, f"{name}: {got.status_code} {got.text[:200]}"
        normal = httpx.post(f"{frontend}/v1/chat/completions", timeout=30, headers=AUTH, json={
            "model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert normal.status_code == 200, f"after {name}: {normal.status_code}"


CHAT = {"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
ROUTES = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
          ("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2}),
          ("GET", "/openapi.json", None), ("GET", "/docs", None), ("GET", "/no/such/route", None),
          # Dynamo's admin route: one call of it without a key made every later request a 529
          ("POST", "/busy_threshold", {"model": NAME, "active_decode_blocks_threshold": 0.0})]


def test_every_route_asks_for_the_key_and_the_probes_stay_open(frontend: str) -> None:
    for method, path, body in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            got = httpx.request(method, f"{frontend}{path}", json=body, headers=headers, timeout=30)
            assert got.status_code == 401, f"{method} {path} with {headers}: {got.status_code} {got.text[:200]}"
            assert got.json()["error"]["code"] == "invalid_api_key" and got.headers["www-authenticate"] == "Bearer"
    for path in ("/health", "/live"):
        assert httpx.get(f"{frontend}{path}", timeout=10).status_code == 200, path
    chat = httpx.post(f"{frontend}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=60)
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text[:300]


def test_nothing_listens_beyond_the_host(frontend: str) -> None:
    """`mbuild serve --replicas` (default --host 127.0.0.1): its frontend, workers, their request, response and event
    planes all listen on loopback only; Dynamo's defaults put several on every interface."""
    port = int(frontend.rsplit(":", 1)[1])
    server = next(p for p in psutil.process_iter(["cmdline"])
                  if "serve" in (p.info["cmdline"] or []) and f"{port}" in (p.info["cmdline"] or []))
    tree = {server.pid, *(child.pid for child in server.children(recursive=True))}
    listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in tree]
    assert len(listening) >= 4, listening  # the gate, the frontend, two workers' planes: the scan saw them
    assert all(c.laddr.ip in ("127.0.0.1", "::1") for c in listening), [c.laddr for c in listening]
