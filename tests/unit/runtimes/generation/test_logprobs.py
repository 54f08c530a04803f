"""Log-probabilities on the OpenAI routes: the engine's own log-softmax, in the completions and chat shapes,
streamed and whole, and the prompt's (echo) as evaluation harnesses read them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtimes.api.app import create_app
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine
from tests.unit.runtimes.api.test_generation_service import CHAT, settings, sse

PROMPT = "The quick brown fox"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    values = logits.astype(np.float64)
    return values - (values.max() + np.log(np.exp(values - values.max()).sum()))


@pytest.fixture(scope="module")
def client(tiny_llm_build: Path) -> Iterator[TestClient]:
    """The served model without a prefix cache: each prompt is prefilled whole, as the reference below does
    (int8's activation scale is per step, so how a prompt is split moves its values in the 4th decimal)."""
    served = dataclasses.replace(settings(tiny_llm_build / "model"), prefix_cache_mb=0)
    with TestClient(create_app(served)) as test_client:
        deadline = time.monotonic() + 60
        while test_client.get("/v1/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield test_client


@pytest.fixture(scope="module")
def engine(tiny_llm_build: Path) -> DecoderEngine:
    """A second engine on the same bundle: the reference for the served values."""
    model = tiny_llm_build / "model"
    return DecoderEngine(model, load_engine_config(model), threads=1, slots=1)


def per_position(engine: DecoderEngine, ids: list[int]) -> np.ndarray:
    """log-softmax after each of `ids`, one token at a time (as the server prefills an echoed prompt)."""
    engine.lengths[:] = 0
    return np.stack([log_softmax(engine.run(0, np.array([[t]], np.int64))[0]) for t in ids])


def greedy(engine: DecoderEngine, prompt: list[int], steps: int) -> list[tuple[int, np.ndarray]]:
    """(token, log-softmax) of each greedy step: the prompt prefilled whole, then one token a step, as served."""
    engine.lengths[:] = 0
    logits = engine.run(0, np.array([prompt], np.int64))[0]
    out = []
    for _ in range(steps):
        values = log_softmax(logits)
        out.append((int(np.argmax(values)), values))
        logits = engine.run(0, np.array([[out[-1][0]]], np.int64))[0]
    return out


def test_completion_logprobs_are_the_engines_and_top1_is_the_greedy_token(client: TestClient,
                                                                          engine: DecoderEngine) -> None:
    prompt = client.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"] and len(logprobs["tokens"]) == 6
    reference = greedy(engine, prompt, 6)
    for (token, values), value, top in zip(reference, logprobs["token_logprobs"], logprobs["top_logprobs"],
                                           strict=True):
        assert len(top) == 5 and value == max(top.values())  # greedy: the chosen token is the most likely
        assert abs(value - values[token]) < 1e-4
        assert sorted(top.values(), reverse=True) == pytest.approx(np.sort(values)[::-1][:5], abs=1e-4)
    assert logprobs["text_offset"] == list(np.cumsum([0] + [len(t) for t in logprobs["tokens"][:-1]]))


def test_echo_gives_the_prompts_logprobs_as_evaluation_harnesses_read_them(client: TestClient,
                                                                           engine: DecoderEngine) -> None:
    """lm-eval's local-completions: token ids, max_tokens 1, logprobs 1, echo; it sums token_logprobs[ctx:-1]."""
    prompt = client.post("/tokenize", json={"prompt": PROMPT + " jumps over"}).json()["tokens"]
    body = {"prompt": [prompt], "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    reference = per_position(engine, prompt)
    for position in range(1, len(prompt)):
        assert abs(logprobs["token_logprobs"][position] - reference[position - 1][prompt[position]]) < 1e-4
        assert len(logprobs["top_logprobs"][position]) == 1
    assert choice["text"].startswith(client.post("/detokenize", json={"tokens": prompt}).json()["prompt"])


def test_streamed_logprobs_equal_the_whole_answers(client: TestClient) -> None:
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2, "echo": True}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    chunks = [c["choices"][0] for c in sse(client, "/v1/completions", {**body, "stream": True}) if c["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    joined = [v for c in chunks if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
    assert joined == whole["logprobs"]["token_logprobs"]


def test_chat_logprobs_shape_streamed_and_whole(client: TestClient) -> None:
    body: dict[str, Any] = {"messages": CHAT, "max_tokens": 5, "temperature": 0, "logprobs": True,
                            "top_logprobs": 3}
    data = client.post("/v1/chat/completions", json=body).json()
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"] == 5
    assert "".join(e["token"] for e in content) == data["choices"][0]["message"]["content"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        assert bytes(entry["bytes"]).decode() == entry["token"]
    chunks = sse(client, "/v1/chat/completions", {**body, "stream": True})
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    plain = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_echo_returns_a_text_prompt_as_sent(client: TestClient) -> None:
    for prompt in (PROMPT, [PROMPT], [PROMPT, "Hello"]):
        choices = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "echo": True}).json()
        sent = [prompt] if isinstance(prompt, str) else prompt
        assert [c["text"][:len(s)] for c, s in zip(choices["choices"], sent, strict=True)] == sent


def test_a_second_warm_up_runs_nothing(engine: DecoderEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft model warms its target up before pricing it and the server warms what it loaded: the engine's first
    steps run once."""
    runs: list[int] = []
    real = engine.run

    def counted(first: int, ids: np.ndarray) -> np.ndarray:
        runs.append(first)
        return real(first, ids)
    monkeypatch.setattr(engine, "run", counted)
    engine.warmed = False
    engine.warm_up()
    assert runs and engine.warmed
    done = len(runs)
    engine.warm_up()
    assert len(runs) == done
