"""Admission on the generation routes, served in-process by the real engine on a tiny Llama: seeds, n,
logit_bias, fields refused by name, whole-request refusal, and metrics that count what happened."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from tests.unit.runtimes.api.test_generation_service import client, sse

__all__ = ["client"]  # the module-scoped service fixture, shared
PROMPT = [1, 15, 27, 33]


def complete(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **body})


def texts(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [c["text"] for c in response.json()["choices"]]


def test_n_choices_of_one_seed_differ_and_repeat(client: TestClient) -> None:
    first = texts(complete(client, n=3, seed=7, temperature=1.0))
    assert len(set(first)) == 3  # seed + index: not three copies of one sample
    assert texts(complete(client, n=3, seed=7, temperature=1.0)) == first


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1, 0])
def test_any_64_bit_seed_works_and_others_streams_are_untouched(client: TestClient, seed: int) -> None:
    stream_body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True}
    alone = "".join(c["choices"][0]["text"] for c in sse(client, "/v1/completions", stream_body))
    with ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(sse, client, "/v1/completions", stream_body) for _ in range(2)]
        seeded = pool.submit(complete, client, seed=seed, temperature=1.0)
        assert seeded.result().status_code == 200, seeded.result().text
        for future in streams:
            assert "".join(c["choices"][0]["text"] for c in future.result()) == alone


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_seeds_beyond_64_bits_are_a_400(client: TestClient, seed: int) -> None:
    response = complete(client, seed=seed)
    assert response.status_code == 400 and "seed" in response.json()["error"]["message"]


def test_logit_bias_is_applied(client: TestClient, tiny_llm_build: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_llm_build / "model" / "tokenizer.json"))
    forced = 42
    text = texts(complete(client, temperature=0, max_tokens=4, logit_bias={str(forced): 100}))[0]
    assert text == tokenizer.decode([forced] * 4, skip_special_tokens=False)
    greedy = texts(complete(client, temperature=0, max_tokens=1))[0]
    first = tokenizer.encode(greedy, add_special_tokens=False).ids[0]
    banned = texts(complete(client, temperature=0, max_tokens=1, logit_bias={str(first): -100}))[0]
    assert banned != greedy


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "guided_decoding_backend", "xgrammar"),
    ("/v1/completions", "guided_whitespace_pattern", " "),
    ("/v1/completions", "logprobs", 6),
    ("/v1/chat/completions", "top_logprobs", 2),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),  # OpenAI's deprecated form of tools
    ("/v1/chat/completions", "logit_bias", {"abc": 1}),
    ("/v1/chat/completions", "logit_bias", {"5": 500}),
])
def test_fields_not_implemented_or_out_of_range_are_refused_by_name(client: TestClient, path: str, field: str,
                                                                     value: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    response = client.post(path, json={**body, field: value})
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]


def test_a_request_that_could_never_fit_is_refused_whole(client: TestClient) -> None:
    loop = client.app.state.service.generation.engine_loop  # type: ignore[attr-defined]
    response = client.post("/v1/completions", json={"prompt": [PROMPT] * 9, "n": 8, "max_tokens": 4})
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_sequences"
    bad = client.post("/v1/completions", json={"prompt": [PROMPT, [1, 99999]], "max_tokens": 4})
    assert bad.status_code == 400  # the second prompt is bad: the first never started either
    assert loop.busy == 0


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^mbuild_{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} not in the scrape"
    return float(match.group(1))


def test_metrics_count_streamed_tokens_and_gauges_settle(client: TestClient) -> None:
    before = client.get("/v1/metrics").text
    chunks = sse(client, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True,
                                             "ignore_eos": True, "stream_options": {"include_usage": True}})
    after = client.get("/v1/metrics").text
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    completion = '{kind="completion"}'
    assert _metric(after, "tokens_total", completion) - _metric(before, "tokens_total", completion) == 12
    prompt = '{kind="prompt"}'
    assert _metric(after, "tokens_total", prompt) - _metric(before, "tokens_total", prompt) == len(PROMPT)
    assert _metric(after, "time_per_output_token_seconds_count") > _metric(before,
                                                                            "time_per_output_token_seconds_count")
    assert _metric(after, "queue_depth") == 0 and _metric(after, "kv_cache_sequences") == 0
    assert _metric(after, "kv_cache_capacity_tokens") > 0
