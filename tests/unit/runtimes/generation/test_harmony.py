"""gpt-oss through openai-harmony, offline: its vocabulary written from the model's tokenizer.json (no download),
the conversation rendered by harmony's renderer, the reply read by its StreamableParser into reasoning_content,
content and tool calls; through the real openai SDK against the served app, whose engine alone is scripted."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from runtimes.bundle import BundleError
from runtimes.generation.harmony import VOCAB_FILE, VOCAB_SHA256, Harmony, detect_harmony, vocabulary_folder
from runtimes.settings import HARMONY_VOCABULARY
from tests.support.scripted_model import (
    GPT_OSS_EOS,
    GPT_OSS_VOCAB,
    ScriptedEngine,
    gpt_oss_tokenizer,
    serving_scripted,
    write_bundle,
)
from tests.unit.runtimes.generation.test_reasoning import streamed

# gpt-oss's chat template writes harmony itself; the server renders with openai-harmony instead, and knows the
# model by these markers.
GPT_OSS_TEMPLATE = ("{{- '<|start|>system<|message|>' }}{%- for message in messages %}{{- '<|start|>' + message.role + "
                    "'<|channel|>final<|message|>' + message.content + '<|end|>' }}{%- endfor %}"
                    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")
WEATHER: Any = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK: list[Any] = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
ANALYSIS = "<|channel|>analysis<|message|>The user asks for the weather. I will answer.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>'
        '{"city": "Paris"}<|call|>')


def test_the_gpt_oss_template_is_read_as_harmony() -> None:
    assert detect_harmony(GPT_OSS_TEMPLATE) and not detect_harmony("{{ '<|im_start|>' }}<think></think>")


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return gpt_oss_tokenizer()


@pytest.fixture(scope="module")
def served(tokenizer_json: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient,
                                                                                             ScriptedEngine]]:
    folder = write_bundle(tmp_path_factory.mktemp("gpt-oss-style"), tokenizer_json, GPT_OSS_VOCAB,
                          GPT_OSS_TEMPLATE, GPT_OSS_EOS, {"eos_token": "<|return|>"})
    scratch = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(scratch))  # where the vocabulary is written, as /tmp in the image
        patch.setenv(HARMONY_VOCABULARY, "")
        patch.delenv(HARMONY_VOCABULARY)  # unset while serving, and as it was after
        with serving_scripted(folder, served_name="m") as (client, engine):
            engine.marker = tuple(harmony(client).encoding.encode("<|start|>assistant", allowed_special="all"))
            yield client, engine


def harmony(client: TestClient) -> Harmony:
    loaded = client.app.state.service.generation.harmony  # type: ignore[attr-defined]
    assert isinstance(loaded, Harmony)
    return loaded


@pytest.fixture
def sdk(served: tuple[TestClient, ScriptedEngine]) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=served[0], max_retries=0)


def script(served: tuple[TestClient, ScriptedEngine], reply: str) -> ScriptedEngine:
    client, engine = served
    engine.reply = harmony(client).encoding.encode(reply, allowed_special="all")
    return engine


def prompt_text(served: tuple[TestClient, ScriptedEngine]) -> str:
    return str(harmony(served[0]).encoding.decode(served[1].prompts[-1]))


def test_the_vocabulary_was_written_from_tokenizer_json_offline(served: tuple[TestClient, ScriptedEngine]) -> None:
    """No download: the folder openai-harmony loaded from holds the file written from the bundle's tokenizer.json,
    which is o200k_base.tiktoken byte for byte (openai-harmony checks the same hash when it loads)."""
    folder = Path(tempfile.gettempdir())
    written = list(folder.glob(f"mbuild-harmony-*/{VOCAB_FILE}"))
    assert len(written) == 1 and hashlib.sha256(written[0].read_bytes()).hexdigest() == VOCAB_SHA256


def test_a_tokenizer_that_is_not_o200k_is_refused_with_what_to_do(tmp_path: Path) -> None:
    small = {"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": []}
    (tmp_path / "tokenizer.json").write_text(json.dumps(small))
    with pytest.raises(BundleError, match="TIKTOKEN_ENCODINGS_BASE"):
        vocabulary_folder(tmp_path / "tokenizer.json", None)
    with pytest.raises(BundleError, match=f"holds no {VOCAB_FILE}"):
        vocabulary_folder(tmp_path / "tokenizer.json", tmp_path)


def test_analysis_is_reasoning_and_final_is_content(served: tuple[TestClient, ScriptedEngine], sdk: OpenAI) -> None:
    script(served, ANALYSIS + FINAL)
    whole = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=200)
    message = whole.choices[0].message
    assert getattr(message, "reasoning_content", None) == "The user asks for the weather. I will answer."
    assert message.content == "It is sunny in Paris." and whole.choices[0].finish_reason == "stop"
    assert streamed(sdk, messages=ASK, max_tokens=200) == (
        "The user asks for the weather. I will answer.", "It is sunny in Paris.", [], "stop")
    assert "<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>" in prompt_text(served)


def test_include_reasoning_false_leaves_the_analysis_out(served: tuple[TestClient, ScriptedEngine],
                                                         sdk: OpenAI) -> None:
    script(served, ANALYSIS + FINAL)
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 200, "extra_body": {"include_reasoning": False}}
    message = sdk.chat.completions.create(model="m", **body).choices[0].message
    assert message.content == "It is sunny in Paris." and getattr(message, "reasoning_content", None) is None
    assert streamed(sdk, **body) == ("", "It is sunny in Paris.", [], "stop")


def test_include_reasoning_false_leaves_the_analysis_logprobs_out(served: tuple[TestClient, ScriptedEngine],
                                                                  sdk: OpenAI) -> None:
    """issue 57: the analysis channel's tokens are reasoning: hidden with it, their logprobs are left out too."""
    script(served, ANALYSIS + FINAL)
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 200, "logprobs": True}
    every = sdk.chat.completions.create(model="m", **body).choices[0].logprobs
    assert "The user asks for the weather." in "".join(e.token for e in every.content or [])  # type: ignore[union-attr]
    hide = {"include_reasoning": False}
    whole = sdk.chat.completions.create(model="m", **body, extra_body=hide).choices[0].logprobs
    stream = sdk.chat.completions.create(model="m", stream=True, **body, extra_body=hide)
    chunks = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    for logprobs in ([whole], chunks):
        text = "".join(e.token for part in logprobs if part for e in part.content or [])
        assert text == "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.", text


def test_a_call_round_trips_and_call_ends_the_reply(served: tuple[TestClient, ScriptedEngine], sdk: OpenAI) -> None:
    engine = script(served, ANALYSIS + CALL + "<|start|>assistant<|channel|>final<|message|>never written")
    whole = sdk.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=200)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("weather", '{"city": "Paris"}')]
    assert whole.usage is not None and whole.usage.completion_tokens <= engine.reply.index(200012) + 1
    assert streamed(sdk, messages=ASK, tools=[WEATHER], max_tokens=200) == (
        "The user asks for the weather. I will answer.", "", [{"name": "weather", "arguments": '{"city": "Paris"}'}],
        "tool_calls")
    assert "type weather = (_: {\ncity: string,\n}) => any;" in prompt_text(served)
    script(served, "<|channel|>final<|message|>Sunny, 20 degrees.<|return|>")
    back = [*ASK, choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp": 20}'}]
    final = sdk.chat.completions.create(model="m", messages=back, tools=[WEATHER], max_tokens=50)
    assert final.choices[0].message.content == "Sunny, 20 degrees."
    text = prompt_text(served)
    assert ('<|start|>assistant to=functions.weather<|channel|>commentary <|constrain|>json<|message|>'
            '{"city": "Paris"}<|call|>') in text
    assert "<|start|>functions.weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20}<|end|>" in text


def test_reasoning_effort_reaches_the_system_message(served: tuple[TestClient, ScriptedEngine], sdk: OpenAI) -> None:
    script(served, FINAL.removeprefix("<|start|>assistant"))
    sdk.chat.completions.create(model="m", messages=ASK, max_tokens=20, reasoning_effort="high")
    assert "\nReasoning: high\n" in prompt_text(served)
    sdk.chat.completions.create(model="m", messages=ASK, max_tokens=20)
    assert "\nReasoning: medium\n" in prompt_text(served)


def test_a_reply_off_the_format_is_content(served: tuple[TestClient, ScriptedEngine], sdk: OpenAI) -> None:
    script(served, "Hello there")
    message = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=20).choices[0].message
    assert message.content == "Hello there"


@pytest.mark.parametrize(("extra", "words"), [
    ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_regex": "a+"}, "guided_regex"),
    ({"reasoning_effort": "minimal"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
])
def test_what_harmony_cannot_do_here_is_a_400_that_says_so(served: tuple[TestClient, ScriptedEngine],
                                                            extra: dict[str, Any], words: str) -> None:
    response = served[0].post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"], response.json()["error"]["message"]
