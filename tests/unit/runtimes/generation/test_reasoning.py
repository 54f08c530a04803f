"""Reasoning apart from the answer (reasoning_content) for a Qwen3-style model: <think> read from the reply as it
streams, tool calls after (or inside) the reasoning, the request's include_reasoning, chat_template_kwargs and
reasoning_effort; through the real openai SDK against the served app, whose engine alone is scripted."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from tokenizers import Tokenizer

from runtimes.generation.chat_template import ChatTemplate, ChatTemplateError
from runtimes.generation.reasoning import ThinkText, detect_reasoning, opened_by
from runtimes.generation.reply import ReplyFormat
from runtimes.generation.tools import TOOL_FORMATS, detect_format
from tests.support.scripted_model import ScriptedEngine, byte_level_tokenizer, serving_scripted, write_bundle

# Qwen3's chat template in its parts that matter here, as the model's tokenizer_config.json writes them: tools in
# the system turn, an assistant turn's reasoning_content (or a <think> block in its content) written back for
# the turns after the last user query, calls as <tool_call> blocks, results as <tool_response> in a user turn,
# and enable_thinking false answered with an empty <think></think> pair.
QWEN3_TEMPLATE = """\
{%- if tools %}{{- '<|im_start|>system\\n' }}\
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\
{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\
{{- '\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> XML tags:\\n\
<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}\
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\
{%- endif %}\
{%- set ns = namespace(last_query_index=messages|length - 1) %}\
{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}\
{%- if ns.last_query_index == messages|length - 1 and message.role == 'user' %}{%- set ns.last_query_index = index %}\
{%- endif %}{%- endfor %}\
{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}\
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\
{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}\
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}\
{%- elif '</think>' in content %}\
{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}\
{%- if loop.index0 > ns.last_query_index and reasoning_content %}\
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}\
{{- content.lstrip('\\n') }}\
{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}\
{%- for tool_call in message.tool_calls or [] %}{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}\
{%- endif %}{%- set tool_call = tool_call.function %}\
{{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}\
{{- tool_call.arguments if tool_call.arguments is string else tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}\
{%- endfor %}{{- '<|im_end|>\\n' }}\
{%- elif message.role == 'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}\
{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\
{%- endif %}"""
WEATHER: Any = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
THOUGHT = "<think>\nThe user wants the weather.\nI should answer.\n</think>\n\n"


def test_the_qwen3_template_is_read_as_a_reasoning_hermes_model() -> None:
    assert detect_reasoning(QWEN3_TEMPLATE) and detect_format(QWEN3_TEMPLATE) == "hermes"
    assert not detect_reasoning("{{ messages }}")
    assert opened_by("<|im_start|>assistant\n<think>\n") and not opened_by("assistant\n<think>\n\n</think>\n\n")


CASES = ["<think>\nI think.\n\n</think>\n\nThe answer.", "  <think>a</think>b", "<thi", "<think>\n\n</think>\n\n",
         "Hello <think>x</think>", "<think> cut off \n", "x\n\n<tool_call>{bad}",
         THOUGHT + '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         '<think>\ncalling <tool_call>{"name": "f", "arguments": {}}</tool_call>']


def read(form: ReplyFormat, chunks: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    reader, reasoning, content = form.reader(), "", ""
    for chunk in chunks:
        more, text = reader.feed(chunk, [])
        reasoning, content = reasoning + more, content + text
    more, text, calls = reader.end()
    return reasoning + more, content + text, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("opened", [False, True])
@pytest.mark.parametrize("tools", [None, "hermes"])
def test_any_chunking_reads_as_the_whole_reply(opened: bool, tools: str | None) -> None:
    form = ReplyFormat(TOOL_FORMATS[tools] if tools else None, think=True, opened=opened)
    rng = random.Random(7)
    for text in CASES:
        whole = read(form, [text])
        for _ in range(60):
            cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
            assert read(form, [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]) == whole


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), [
    ("<think>\nI think.\n\n</think>\n\nThe answer.", False, "I think.", "The answer."),
    ("I reason.\n</think>\n\nAnswer", True, "I reason.", "Answer"),  # the prompt opened it (DeepSeek-R1)
    ("No thinking here.", False, "", "No thinking here."),  # enable_thinking false: no <think> at all
    ("<think>\ncut off", False, "cut off", ""),  # max_tokens inside the reasoning
])
def test_reasoning_is_told_apart_from_the_answer(text: str, opened: bool, reasoning: str, content: str) -> None:
    reader = ThinkText(opened)
    first, second = reader.feed(text)
    rest = reader.end()
    assert (first + rest[0], second + rest[1]) == (reasoning, content)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return byte_level_tokenizer(["<think>", "</think>", "<tool_call>", "</tool_call>"],
                                ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


@pytest.fixture(scope="module")
def served(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient,
                                                                                              ScriptedEngine]]:
    end = tokenizer.token_to_id("<|im_end|>")
    assert end is not None
    folder = write_bundle(tmp_path_factory.mktemp("qwen3-style"), tokenizer.to_str(), tokenizer.get_vocab_size(),
                          QWEN3_TEMPLATE, (end,), {"eos_token": "<|im_end|>"})
    with serving_scripted(folder, served_name="m") as (client, engine):
        engine.marker = tuple(tokenizer.encode("<|im_start|>assistant\n").ids)
        yield client, engine


@pytest.fixture
def sdk(served: tuple[TestClient, ScriptedEngine]) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=served[0], max_retries=0)


def script(served: tuple[TestClient, ScriptedEngine], tokenizer: Tokenizer, reply: str) -> ScriptedEngine:
    engine = served[1]
    engine.reply = [*tokenizer.encode(reply).ids, *engine.config.decoder.eos_token_ids]
    return engine


def streamed(sdk: OpenAI, **body: Any) -> tuple[str, str, list[dict[str, str]], str | None]:
    """(reasoning, content, calls, finish) as the SDK's stream of deltas adds them up."""
    reasoning, content, calls, finish = "", "", dict[int, dict[str, str]](), None
    for chunk in sdk.chat.completions.create(model="m", stream=True, **body):
        choice = chunk.choices[0]
        reasoning += getattr(choice.delta, "reasoning_content", None) or ""
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or "" if call.function else ""
            entry["arguments"] += call.function.arguments or "" if call.function else ""
        finish = choice.finish_reason or finish
    return reasoning, content, list(calls.values()), finish


def test_reasoning_content_comes_apart_and_the_stream_adds_up_to_it(served: tuple[TestClient, ScriptedEngine],
                                                                    tokenizer: Tokenizer, sdk: OpenAI) -> None:
    script(served, tokenizer, THOUGHT + "It is sunny in Paris.")
    whole = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=200)
    message = whole.choices[0].message
    assert getattr(message, "reasoning_content", None) == "The user wants the weather.\nI should answer."
    assert message.content == "It is sunny in Paris." and whole.choices[0].finish_reason == "stop"
    got = streamed(sdk, messages=ASK, max_tokens=200)
    assert got == (getattr(message, "reasoning_content", None), message.content, [], "stop")


def test_include_reasoning_false_leaves_it_out(served: tuple[TestClient, ScriptedEngine], tokenizer: Tokenizer,
                                               sdk: OpenAI) -> None:
    script(served, tokenizer, THOUGHT + "Sunny.")
    whole = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=200,
                                        extra_body={"include_reasoning": False})
    assert whole.choices[0].message.content == "Sunny."
    assert getattr(whole.choices[0].message, "reasoning_content", None) is None
    assert streamed(sdk, messages=ASK, max_tokens=200, extra_body={"include_reasoning": False}) == (
        "", "Sunny.", [], "stop")


CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("reply", [THOUGHT + CALL, "<think>\nI need the weather.\n" + CALL],
                         ids=["after-the-reasoning", "inside-the-reasoning"])
def test_a_call_after_or_inside_the_reasoning_is_found(served: tuple[TestClient, ScriptedEngine],
                                                       tokenizer: Tokenizer, sdk: OpenAI, reply: str) -> None:
    script(served, tokenizer, reply)
    whole = sdk.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=200)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("weather", '{"city": "Paris"}')]
    assert getattr(choice.message, "reasoning_content", None) in ("The user wants the weather.\nI should answer.",
                                                                  "I need the weather.")
    got = streamed(sdk, messages=ASK, tools=[WEATHER], max_tokens=200)
    assert got == (getattr(choice.message, "reasoning_content", None), "",
                   [{"name": "weather", "arguments": '{"city": "Paris"}'}], "tool_calls")


def prompt_text(engine: ScriptedEngine, tokenizer: Tokenizer) -> str:
    return tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)


def test_chat_template_kwargs_reach_the_template(served: tuple[TestClient, ScriptedEngine], tokenizer: Tokenizer,
                                                 sdk: OpenAI) -> None:
    engine = script(served, tokenizer, "<think>\n\n</think>\n\nHi there.")  # the prompt already holds the pair
    whole = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=50,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert prompt_text(engine, tokenizer).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert whole.choices[0].message.content == "Hi there."
    assert getattr(whole.choices[0].message, "reasoning_content", None) is None


def test_reasoning_sent_back_reaches_the_template(served: tuple[TestClient, ScriptedEngine], tokenizer: Tokenizer,
                                                  sdk: OpenAI) -> None:
    engine = script(served, tokenizer, "Sunny, 20 degrees.")
    called: Any = {"role": "assistant", "content": None, "reasoning_content": "I need the weather.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}
    result: Any = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 20}'}
    sdk.chat.completions.create(model="m", messages=[*ASK, called, result], tools=[WEATHER],
                                max_tokens=50)
    text = prompt_text(engine, tokenizer)
    assert "<think>\nI need the weather.\n</think>\n\n<tool_call>\n" in text
    assert "<tool_response>\n{\"temp\": 20}\n</tool_response>" in text


@pytest.mark.parametrize(("extra", "words"), [
    ({"include_reasoning": "no"}, "include_reasoning"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": {"deep": True}}}, "enable_thinking"),
    ({"chat_template_kwargs": {f"k{i}": i for i in range(17)}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "set by the server"),
    ({"chat_template_kwargs": {"bos_token": "x"}}, "set by the server"),
    ({"chat_template_kwargs": {"a b": 1}}, "template variable names"),
    ({"chat_template_kwargs": {"note": "x" * 2000}}, "1024"),
    ({"chat_template_kwargs": {"namespace": 1}}, "a function the chat template may call"),  # issue 57: was a 500
    ({"chat_template_kwargs": {"range": [1]}}, "a function the chat template may call"),
    ({"chat_template_kwargs": {"raise_exception": 1}}, "a function the chat template may call"),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}, "not both"),
])
def test_bad_reasoning_fields_are_400s_that_say_why(served: tuple[TestClient, ScriptedEngine], extra: dict[str, Any],
                                                    words: str) -> None:
    response = served[0].post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"], response.json()["error"]["message"]


def test_a_template_variable_render_itself_uses_still_renders(served: tuple[TestClient, ScriptedEngine],
                                                             tokenizer: Tokenizer) -> None:
    """issue 57: "self" collided with jinja's render(self, ...): a 500 with a traceback."""
    script(served, tokenizer, "Hi.")
    response = served[0].post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 8,
                                                            "chat_template_kwargs": {"self": 1}})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hi."


def test_a_template_that_fails_on_a_requests_variable_is_a_400() -> None:
    """A template is the model's code run on the request's values: whatever it raises is the request's 400
    (invalid_messages), never a 500 with a traceback (issue 57)."""
    template = ChatTemplate("{{ '<|im_start|>' + (limit + 1) | string }}{% for m in messages %}{{ m.content }}"
                            "{% endfor %}", {})
    assert template.render(ASK, extra={"limit": 1}) == "<|im_start|>2Weather in Paris?"
    for bad in ({"limit": "x"}, {"limit": None}):
        with pytest.raises(ChatTemplateError, match="the chat template failed on these messages"):
            template.render(ASK, extra=bad)


@pytest.fixture(scope="module")
def served_special(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, ScriptedEngine,
                                                                             Tokenizer]]:
    """The same model with its think and tool-call markers special tokens (as Mistral's [TOOL_CALLS] is)."""
    tokenizer = byte_level_tokenizer([], ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                          "<tool_call>", "</tool_call>"])
    end = tokenizer.token_to_id("<|im_end|>")
    assert end is not None
    folder = write_bundle(tmp_path_factory.mktemp("qwen3-special"), tokenizer.to_str(), tokenizer.get_vocab_size(),
                          QWEN3_TEMPLATE, (end,), {"eos_token": "<|im_end|>"})
    with serving_scripted(folder, served_name="m") as (client, engine):
        engine.marker = tuple(tokenizer.encode("<|im_start|>assistant\n").ids)
        yield client, engine, tokenizer


@pytest.mark.parametrize("special_markers", [False, True])
@pytest.mark.parametrize("tools", [None, [WEATHER]])
def test_no_special_token_but_the_markers_reaches_the_reply(served: tuple[TestClient, ScriptedEngine],
                                                            tokenizer: Tokenizer,
                                                            served_special: tuple[TestClient, ScriptedEngine,
                                                                                  Tokenizer],
                                                            special_markers: bool, tools: Any) -> None:
    """issue 57: a chat with reasoning or tools decoded every special token into the text, so <|im_start|> and
    <|endoftext|> reached content. Only the markers the readers read stay (and are read: reasoning and calls)."""
    client, engine, vocabulary = served_special if special_markers else (*served, tokenizer)
    sdk = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    extra = {"tools": tools} if tools else {}
    script((client, engine), vocabulary, THOUGHT + "Sunny.<|im_start|>user<|endoftext|>")
    message = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=200, **extra).choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == (
        "Sunny.user", "The user wants the weather.\nI should answer.")
    assert streamed(sdk, messages=ASK, max_tokens=200, **extra)[:2] == (
        "The user wants the weather.\nI should answer.", "Sunny.user")
    kept = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 200, "skip_special_tokens": False,
                                                     **extra})
    assert kept.json()["choices"][0]["message"]["content"] == "Sunny.<|im_start|>user<|endoftext|>"  # as asked
    if tools:
        script((client, engine), vocabulary, THOUGHT + CALL)
        choice = sdk.chat.completions.create(model="m", messages=ASK, max_tokens=200, **extra).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == [  # type: ignore[union-attr]
            ("weather", '{"city": "Paris"}')]


def logprob_text(choice: Any) -> str:
    return "".join(entry.token for entry in choice.logprobs.content or [])


@pytest.mark.parametrize("reply", [THOUGHT + "Sunny, 20 degrees.", "<think>\nThe user wants the weather.\n"],
                         ids=["answered", "cut-off-while-reasoning"])
def test_include_reasoning_false_leaves_its_logprobs_out_too(served: tuple[TestClient, ScriptedEngine],
                                                            tokenizer: Tokenizer, sdk: OpenAI, reply: str) -> None:
    """issue 57: with include_reasoning false and logprobs, logprobs.content spelled out the hidden reasoning token
    by token. Its tokens, tags included, are left out; the answer's stay, as its content is, streamed or not."""
    script(served, tokenizer, reply)
    answer = reply.split("</think>\n\n")[1] if "</think>" in reply else ""
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 200, "logprobs": True, "top_logprobs": 2}
    shown = sdk.chat.completions.create(model="m", **body).choices[0]
    assert logprob_text(shown) == reply  # with the reasoning: every token
    hidden = sdk.chat.completions.create(model="m", **body, extra_body={"include_reasoning": False}).choices[0]
    assert hidden.message.content == answer and logprob_text(hidden) == answer
    assert all(len(entry.top_logprobs) == 2 for entry in hidden.logprobs.content or [])  # type: ignore[union-attr]
    chunks = list(sdk.chat.completions.create(model="m", stream=True, **body, extra_body={"include_reasoning": False}))
    assert "".join(logprob_text(c.choices[0]) for c in chunks if c.choices and c.choices[0].logprobs) == answer
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
