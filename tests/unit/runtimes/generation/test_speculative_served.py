"""Speculative decoding on the real engine: the tiny Llama trained on a short text (tests/support/tiny_models.py), so
its greedy continuation repeats that text and n-gram lookup's drafts are often right (and wrong where a prompt
says otherwise before). Served with speculation on,
every answer must equal speculation off token for token, alone and several at once, with a prefix-cache hit; the
drafts must have run (timings), been accepted and been refused (so verify rows and the cache's take-back ran on the
graph)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.runtimes.api.test_generation_service import serving

PROMPTS = ["The quick brown fox jumps over the lazy dog. Containers package software",
           "Hello, world! How are you today? I am a tiny language model",
           "def add(a, b):\n    return a + b\n\nThe quick brown fox",
           "The quick brown cat sleeps on the mat. Hello, world! How are you? The quick brown"]  # lookup drafts "cat"


def _answers(client: Any, prompts: list[str], n: int) -> tuple[list[list[str]], dict[str, int]]:
    body = {"model": "tiny", "prompt": prompts, "max_tokens": 48, "temperature": 0, "n": n, "logprobs": 1}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    tokens = [choice["logprobs"]["tokens"] for choice in sorted(data["choices"], key=lambda c: c["index"])]
    return tokens, data.get("timings", {})


def same_greedy_answers(model: Path, batch: int, **on: Any) -> tuple[int, int]:
    """Every prompt alone, then all with n=2, then the first again (a prefix-cache hit), served with speculation
    off and with `on`'s settings: the answers must be the same; returns (drafted, accepted) with it on."""
    with serving(model, served_name="tiny", max_batch=batch, speculative="off") as off_client:
        off = [_answers(off_client, [p], 1)[0] for p in PROMPTS] + [_answers(off_client, PROMPTS, 2)[0]]
    with serving(model, served_name="tiny", max_batch=batch, **on) as client:
        answers, timings = [], []
        for prompts, n in [([p], 1) for p in PROMPTS] + [(PROMPTS, 2)]:
            tokens, counts = _answers(client, prompts, n)
            answers.append(tokens)
            timings.append(counts)
        again, counts = _answers(client, [PROMPTS[0]], 1)  # its prompt's blocks come from the prefix cache
        metrics = client.get("/v1/metrics").text
    assert answers == off and again == off[0]
    assert "mbuild_prefix_cache_hits_total 0" not in metrics
    return sum(t["draft_n"] for t in [*timings, counts]), sum(t["draft_n_accepted"] for t in [*timings, counts])


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_answers_are_the_same_with_speculation_on(tiny_llm_build: Path, batch: int) -> None:
    drafted, accepted = same_greedy_answers(tiny_llm_build / "model", batch, speculative="ngram")
    print(f"batch {batch}: {accepted} of {drafted} drafts accepted")
    assert 0 < accepted < drafted


def test_a_verify_rows_tokens_stream_as_one_chunk(tiny_llm_build: Path) -> None:
    """Streamed with lookup on, a verify row's accepted tokens go out together: fewer text chunks than tokens, and
    together the same text and count as the whole answer."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 48, "temperature": 0}
    with serving(tiny_llm_build / "model", served_name="tiny", speculative="ngram") as client:
        whole = client.post("/v1/completions", json=body).json()
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/completions", json=streamed) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    texts = [e["choices"][0]["text"] for e in events if e.get("choices")]
    usage = events[-1]["usage"]
    assert "".join(texts) == whole["choices"][0]["text"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 48
    assert events[-1]["timings"]["draft_n_accepted"] > 0
    assert len(texts) < usage["completion_tokens"] - events[-1]["timings"]["draft_n_accepted"] / 2
