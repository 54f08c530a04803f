"""A tiny random Llama made at test time goes through the whole pipeline into an image that speaks OpenAI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.conftest import BASE_IMAGE
from tests.support.containers import docker
from tests.support.procs import mbuild
from tests.support.runners import docker_run
from tests.support.tiny_models import make_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TAG = "mbuild-test/tiny-llama:it"
MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Tell me about containers"}]


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights, untrained; with flat logits only fp32 decodes token-exactly, so fp32 it is."""
    return make_tiny_llama(tmp_path_factory.mktemp("random-llama"), train_steps=0, seed=1)


@pytest.fixture(scope="module")
def llm_image(random_llama: Path, docker_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    docker("rmi", "-f", TAG)
    out = tmp_path_factory.mktemp("llm-image")
    result = mbuild("package", str(random_llama), "--precision", "fp32", "--backend", "docker", "--base-image",
                    BASE_IMAGE, "--name", TAG.split(":")[0], "--version", "it", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "greedy decode equal to transformers on 4/4 prompts" in result.stderr
    yield TAG
    docker("rmi", "-f", TAG)


def test_openai_sdk_chat_and_stream_against_the_image(llm_image: str, random_llama: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(random_llama)
    model = AutoModelForCausalLM.from_pretrained(random_llama).eval()
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(rendered, add_special_tokens=False).input_ids  # the template writes the BOS
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=32, do_sample=False)
    expected = tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)

    with docker_run(llm_image) as url, OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        name = client.models.list().data[0].id
        whole = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=32,  # type: ignore
                                               temperature=0)
        assert whole.choices[0].message.content == expected  # greedy equals transformers' generate
        assert whole.usage is not None and whole.usage.prompt_tokens == len(prompt)
        stream = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=32,  # type: ignore
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        deltas, usage = [], None
        for chunk in stream:
            if chunk.choices:
                deltas.append(chunk.choices[0].delta.content or "")
            if chunk.usage:
                usage = chunk.usage
        assert "".join(deltas) == whole.choices[0].message.content
        assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_openai_sdk_logprobs_and_echo_against_the_image(llm_image: str, random_llama: Path) -> None:
    """Chat logprobs' top-1 is the greedy token; completions' echo gives the prompt's logprobs; both match
    transformers' fp32 log-softmax within 1e-4 (the image is fp32)."""
    tokenizer = AutoTokenizer.from_pretrained(random_llama)
    model = AutoModelForCausalLM.from_pretrained(random_llama).eval()
    prompt = tokenizer("The quick brown fox jumps").input_ids
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
    with docker_run(llm_image) as url, OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        name = client.models.list().data[0].id
        assert client.models.retrieve(name).id == name
        chat = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=8,  # type: ignore
                                              temperature=0, logprobs=True, top_logprobs=3)
        content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content is not None and len(content) == 8
        for entry in content:
            assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        echo = client.completions.create(model=name, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                         echo=True)
        logprobs = echo.choices[0].logprobs
        assert logprobs is not None and logprobs.token_logprobs is not None
        assert logprobs.token_logprobs[0] is None and len(logprobs.token_logprobs) == len(prompt) + 1
        for position in range(1, len(prompt) + 1):
            # position p's value is the log-probability of token p given the tokens before it
            want = reference[position - 1][prompt[position]] if position < len(prompt) else reference[-1].max()
            assert abs(logprobs.token_logprobs[position] - float(want)) < 1e-4


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
                    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}}]
ORDER = {"type": "object", "additionalProperties": False, "required": ["item", "qty", "rush"],
         "properties": {"item": {"type": "string", "maxLength": 16}, "qty": {"type": "integer", "minimum": 1,
                                                                              "maximum": 99},
                        "rush": {"type": "boolean"}}}


def test_openai_sdk_tools_and_structured_output_against_the_image(llm_image: str) -> None:
    """Two tools offered and both called in turn (named tool_choice: the random model would not choose), each
    result sent back, then a final reply; the same call streamed as deltas; json_schema answers that validate
    on 20 samples at temperature 1."""
    schemas = {"get_weather": WEATHER, "get_time": ZONE}
    history: list[Any] = [{"role": "user", "content": "Weather in Oslo and the time in Tokyo?"}]
    with docker_run(llm_image) as url, OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        name = client.models.list().data[0].id
        made = []
        for tool in ("get_weather", "get_time"):
            choice: Any = {"type": "function", "function": {"name": tool}}
            reply = client.chat.completions.create(model=name, messages=history, tools=TOOLS, tool_choice=choice,
                                                   temperature=0, max_tokens=200)
            calls = reply.choices[0].message.tool_calls or []
            assert reply.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == [tool]  # type: ignore[union-attr]
            jsonschema.validate(json.loads(calls[0].function.arguments), schemas[tool])  # type: ignore[union-attr]
            made.append(calls[0])
            history += [reply.choices[0].message,
                        {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"ok": tool})}]
        final = client.chat.completions.create(model=name, messages=history, tools=TOOLS, max_tokens=8,
                                               temperature=0, extra_body={"min_tokens": 8})
        assert final.choices[0].message.content and not final.choices[0].message.tool_calls

        streamed: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in client.chat.completions.create(model=name, messages=history[:1], tools=TOOLS,
                                                    tool_choice={"type": "function",
                                                                 "function": {"name": "get_weather"}},
                                                    temperature=0, max_tokens=200, stream=True):
            for delta in chunk.choices[0].delta.tool_calls or []:
                entry = streamed.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += (delta.function and delta.function.name) or ""
                entry["arguments"] += (delta.function and delta.function.arguments) or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert list(streamed.values()) == [{"name": "get_weather", "arguments": made[0].function.arguments}]  # type: ignore[union-attr]

        form: Any = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
        answers = []
        for seed in range(5):
            reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "An order"}],
                                                   response_format=form, temperature=1, n=4, seed=seed,
                                                   max_tokens=200)
            answers += [(c.message.content or "", c.finish_reason) for c in reply.choices]
        assert len(answers) == 20 and all(finish == "stop" for _, finish in answers), answers
        for text, _ in answers:
            jsonschema.validate(json.loads(text), ORDER)
