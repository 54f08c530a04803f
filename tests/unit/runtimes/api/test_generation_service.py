"""The OpenAI text-generation routes, served in-process by the real engine on a tiny Llama."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from runtimes.api.app import create_app
from runtimes.settings import Settings

CHAT = [{"role": "user", "content": "Hello, how are you"}]


def settings(model_dir: Path) -> Settings:
    return Settings(model_dir=model_dir, host="127.0.0.1", port=8000, api_key=None, log_level="info",
                    log_format="text", threads=1, max_queue=64, served_name=None)


@contextmanager
def serving(model_dir: Path, **overrides: Any) -> Iterator[TestClient]:
    """The app on the bundle, in-process, once it reports ready."""
    with TestClient(create_app(dataclasses.replace(settings(model_dir), **overrides))) as test_client:
        deadline = time.monotonic() + 60
        while test_client.get("/v1/health/ready").status_code != 200:
            assert time.monotonic() < deadline, test_client.get("/v1/health/ready").json()
            time.sleep(0.05)
        yield test_client


@pytest.fixture(scope="module")
def client(tiny_llm_build: Path) -> Iterator[TestClient]:
    with serving(tiny_llm_build / "model") as test_client:
        yield test_client


def chat(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"messages": CHAT, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def sse(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_chat_completion_shape_and_usage(client: TestClient) -> None:
    data = chat(client, max_tokens=12)
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 12
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 12


def test_streamed_deltas_equal_the_whole_answer(client: TestClient) -> None:
    whole = chat(client, max_tokens=24)["choices"][0]["message"]["content"]
    chunks = sse(client, "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 24,
                                                  "stream": True, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24


def test_greedy_output_equals_transformers_generate(client: TestClient, tiny_llama: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    for text in ("The quick brown fox", "def add(a, b):", "Hello, world!"):
        ids = tokenizer(text).input_ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=32, do_sample=False)
        want = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
        got = client.post("/v1/completions", json={"prompt": text, "max_tokens": 32, "temperature": 0}).json()
        assert got["choices"][0]["text"] == want


def test_sixteen_at_once_equal_their_single_runs_and_ran_batched(client: TestClient) -> None:
    prompts = [("The quick brown fox " * (1 + i % 4)).strip() for i in range(16)]
    lengths = [4 + 3 * (i % 5) for i in range(16)]

    def complete(i: int) -> str:
        body = {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0}
        return str(client.post("/v1/completions", json=body).json()["choices"][0]["text"])

    single = [complete(i) for i in range(16)]
    before = batch_histogram(client)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(complete, range(16)))
    assert together == single
    after = batch_histogram(client)
    ran_batched = sum(after.get(b, 0) - before.get(b, 0) for b in after if b > 1)
    assert ran_batched > 0, f"no engine step ran more than one sequence: {before} -> {after}"


def batch_histogram(client: TestClient) -> dict[float, int]:
    """Engine steps per batch-size bucket (non-cumulative), from /v1/metrics."""
    text = client.get("/v1/metrics").text
    cumulative = {float(le): int(n) for le, n in re.findall(r'mbuild_batch_size_bucket\{le="([0-9.]+)"\} (\d+)', text)}
    result, previous = {}, 0
    for bound in sorted(cumulative):
        result[bound] = cumulative[bound] - previous
        previous = cumulative[bound]
    return result


def test_seeded_sampling_reproduces(client: TestClient) -> None:
    body = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 16, "seed": 1234}
    first, second = chat(client, **body), chat(client, **body)
    assert first["choices"][0]["message"] == second["choices"][0]["message"]


def test_stop_strings_and_n(client: TestClient) -> None:
    base = client.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 16, "temperature": 0}).json()
    text = base["choices"][0]["text"]
    stop = text[4:8]
    stopped = client.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 16, "temperature": 0,
                                                   "stop": [stop]}).json()
    assert stopped["choices"][0]["text"] == text[: text.index(stop)]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    two = client.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 8, "temperature": 0,
                                               "n": 2}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["text"] == two["choices"][1]["text"]


def test_token_id_prompts_and_eos_stop(client: TestClient, tiny_llama: Path) -> None:
    ids = AutoTokenizer.from_pretrained(tiny_llama)("The quick brown fox").input_ids
    by_ids = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0}).json()
    by_text = client.post("/v1/completions", json={"prompt": "The quick brown fox", "max_tokens": 8,
                                                   "temperature": 0}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 5000}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "x " * 1200, "max_tokens": 4}, 400, "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": []}, 400, "invalid_request"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": 3}, 400, "invalid_request"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "other/model"}, 404, "model_not_found"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "invalid_request"),  # needs logprobs
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "invalid_request"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request"),
    ("/v1/completions", {"prompt": [999999], "max_tokens": 2}, 400, "invalid_token_id"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400, "invalid_request"),
    ("/v1/embeddings", {"input": "x"}, 404, "wrong_task"),
])
def test_bad_requests(client: TestClient, path: str, body: dict[str, Any], status: int, code: str) -> None:
    response = client.post(path, json=body)
    assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text
    assert client.get("/v1/health/ready").status_code == 200


def test_context_error_names_the_limit(client: TestClient) -> None:
    message = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5000}).json()
    assert "maximum context length is 1024 tokens" in message["error"]["message"]


def test_metadata_reports_the_gate(client: TestClient) -> None:
    validation = client.get("/v1/metadata").json()["validation"]
    assert validation["passed"] is True and validation["greedy_equal"] == 4


def vllm_series(client: TestClient) -> dict[tuple[str, str], float]:
    """/metrics parsed as Prometheus parses it: vLLM-named samples by (name, model_name)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, sample.labels.get("model_name", "")): sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name.startswith("vllm:")}


def test_vllm_named_metrics_count_what_was_served(client: TestClient) -> None:
    name = client.get("/v1/models").json()["data"][0]["id"]
    before = vllm_series(client)
    whole = chat(client, max_tokens=7)
    chunks = sse(client, "/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 5,
                                                  "stream": True, "stream_options": {"include_usage": True}})
    usages = [whole["usage"], chunks[-1]["usage"]]
    after = vllm_series(client)

    def grew(series: str) -> float:
        return after[(series, name)] - before.get((series, name), 0.0)

    assert grew("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert grew("vllm:generation_tokens_total") == 12  # the stream's tokens counted too
    assert grew("vllm:time_to_first_token_seconds_count") == 2
    assert grew("vllm:time_per_output_token_seconds_count") == 12 - 2  # the gaps after each first token
    assert after[("vllm:num_requests_running", name)] == 0 and after[("vllm:num_requests_waiting", name)] == 0
    assert 0 <= after[("vllm:gpu_cache_usage_perc", name)] <= 1


def test_tokenize_counts_what_the_completions_count_and_detokenize_inverts_it(client: TestClient) -> None:
    counted = client.post("/tokenize", json={"messages": CHAT}).json()
    assert counted["count"] == len(counted["tokens"]) == chat(client, max_tokens=1)["usage"]["prompt_tokens"]
    assert counted["max_model_len"] > counted["count"]
    text = "The quick brown fox"
    plain = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    completion = client.post("/v1/completions", json={"prompt": text, "max_tokens": 1}).json()
    assert completion["usage"]["prompt_tokens"] >= plain["count"]  # the completion adds BOS when the model does
    assert client.post("/detokenize", json={"tokens": plain["tokens"]}).json() == {"prompt": text}
    both = client.post("/tokenize", json={"prompt": text, "messages": CHAT})
    assert both.status_code == 400 and "either 'prompt' or 'messages'" in both.json()["error"]["message"]
    outside = client.post("/detokenize", json={"tokens": [1, 10**9]})
    assert outside.status_code == 400 and outside.json()["error"]["code"] == "invalid_token_id"
