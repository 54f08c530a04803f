"""Tool calling: the three formats read from model text, the grammars that force a call, and the OpenAI shapes
served in-process by the real engine on the tiny Llama (whose chat template renders tools as Llama 3.1 does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from runtimes.generation.chat_template import ChatTemplate
from runtimes.generation.guided import Grammars
from runtimes.generation.tools import TOOL_FORMATS, ToolText, detect_format
from runtimes.settings import TOOL_PARSERS
from tests.support.tiny_models import CHAT_TEMPLATE
from tests.unit.runtimes.api.test_generation_service import serving, sse

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
           "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
FUNCTIONS: list[dict[str, Any]] = [{"name": "weather", "parameters": WEATHER}, {"name": "time", "parameters": ZONE}]
TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]
PARAMETERS = {"weather": WEATHER, "time": ZONE}
ASK = [{"role": "user", "content": "Weather in Paris, and the time?"}]
# Phi-4-mini-instruct's chat template (tokenizer_config.json): a system message's "tools", a JSON string, is
# written between <|tool|> and <|/tool|>; the template never reads the `tools` variable.
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
    "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' "
    "+ '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
# Granite 3.x instruct's, in the parts that name tools: an available_tools turn, a call written back after
# <|tool_call|>.
GRANITE_TEMPLATE = (
    "{%- if tools %}{{- '<|start_of_role|>available_tools<|end_of_role|>' + tools | tojson(indent=4) + "
    "'<|end_of_text|>\n' }}{%- endif %}{%- for message in messages %}{%- if message['role'] == 'assistant_tool_call' %}"
    "{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + message['content'] + '<|end_of_text|>\n' }}"
    "{%- else %}{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + "
    "'<|end_of_text|>\n' }}{%- endif %}{%- endfor %}")


def test_every_settings_name_has_a_format() -> None:
    assert set(TOOL_FORMATS) == set(TOOL_PARSERS)


@pytest.mark.parametrize(("template", "found"), [
    (CHAT_TEMPLATE, "llama3_json"), ("{{ '<tool_call>' }}", "hermes"), ("[TOOL_CALLS] {{ tools }}", "mistral"),
    (PHI4_MINI_TEMPLATE, "phi4_mini"), (GRANITE_TEMPLATE, "granite"), ("{{ messages }}", None)])
def test_the_format_comes_from_the_chat_template(template: str, found: str | None) -> None:
    assert detect_format(template) == found


@pytest.mark.parametrize(("form", "text", "content", "calls"), [
    ("llama3_json", ' {"name": "f", "parameters": {"a": 1}}', None, [("f", {"a": 1})]),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"b": "x"}}', None,
     [("f", {}), ("g", {"b": "x"})]),
    ("llama3_json", 'The answer is {"name": "f"}', 'The answer is {"name": "f"}', []),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1', '{"name": "f", "parameters": {"a": 1', []),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
               '<tool_call>{"name": "g", "arguments": {}}</tool_call>', "Let me look.", [("f", {"a": 1}), ("g", {})]),
    ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "f", "arguments": {"x": "y"}}, {"name": "g", "arguments": {}}]', "Sure.",
     [("f", {"x": "y"}), ("g", {})]),
    ("mistral", "No calls here.", "No calls here.", []),
    ("phi4_mini", 'Sure.<|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
                  "<|/tool_call|>", "Sure.", [("f", {"a": 1}), ("g", {})]),
    ("phi4_mini", '<|tool_call|>[{"name": "f", "arguments": {}}]<|/tool_call|><|tool_call|>[{"name": "g", '
                  '"arguments": {}}]<|/tool_call|>', None, [("f", {}), ("g", {})]),
    ("phi4_mini", "Just text.", "Just text.", []),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"x": "y"}}]', None, [("f", {"x": "y"})]),
    ("granite", ' <tool_call>[{"name": "f", "arguments": {}}]', None, [("f", {})]),
    ("granite", 'First text <|tool_call|>[{"name": "f", "arguments": {}}]',
     'First text <|tool_call|>[{"name": "f", "arguments": {}}]', []),  # a Granite call opens the reply
])
def test_calls_are_read_from_each_formats_text(form: str, text: str, content: str | None,
                                               calls: list[tuple[str, dict[str, Any]]]) -> None:
    got_content, got = TOOL_FORMATS[form].split(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got)


@pytest.mark.parametrize(("form", "pieces", "sent", "calls"), [
    ("hermes", ["Hi <to", "ol_c", 'all>{"name": "f",', ' "arguments": {}}</tool_call>'], "Hi", ["f"]),
    ("hermes", ["Hi \n", "<tool_call>{bad"], "Hi \n<tool_call>{bad", []),
    ("hermes", ["a <", "b"], "a <b", []),
    ("llama3_json", [" ", '{"na', 'me": "f", "parameters": {}}'], "", ["f"]),
    ("llama3_json", [" ", "Hel", "lo {"], " Hello {", []),
    ("mistral", ["ok [TOOL_", 'CALLS][{"name": "f", "arguments": {}}]'], "ok", ["f"]),
    ("phi4_mini", ["ok <|tool", '_call|>[{"name": "f", "arguments": {}}]<|/tool_call|>'], "ok", ["f"]),
    ("granite", [" <|tool_", 'call|>[{"name": "f", "arguments": {}}]'], "", ["f"]),
    ("granite", ["Hel", "lo <|tool_call|>"], "Hello <|tool_call|>", []),
])
def test_a_stream_sends_content_at_once_and_holds_calls(form: str, pieces: list[str], sent: str,
                                                        calls: list[str]) -> None:
    text = ToolText(TOOL_FORMATS[form])
    out = "".join(text.feed(piece) for piece in pieces)
    rest, got = text.end()
    assert out + rest == sent and [c.name for c in got] == calls


@pytest.fixture(scope="module")
def marked_tokenizer(tiny_llama: Path) -> Tokenizer:
    """The tiny vocabulary plus the formats' markers as special tokens, as Qwen2's and Mistral's have them."""
    tokenizer = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    tokenizer.add_special_tokens(MARKERS)
    return tokenizer


MARKERS = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|tool_call|>", "<|/tool_call|>"]


@pytest.mark.parametrize(("form", "call"), [
    ("hermes", '<tool_call>\n{"name": "time", "arguments": {"zone": "CET"}}\n</tool_call>'),
    ("mistral", '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]'),
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Oslo"}}'),
    ("phi4_mini", '<|tool_call|>[{"name": "time", "arguments": {"zone": "CET"}}, {"name": "weather", "arguments": '
                  '{"city": "Oslo"}}]<|/tool_call|>'),
    ("granite", '<|tool_call|>[{"name": "weather", "arguments": {"city": "Oslo"}}]'),
])
def test_forced_grammars_accept_a_call_and_nothing_else(marked_tokenizer: Tokenizer, form: str, call: str) -> None:
    ids = {s: marked_tokenizer.token_to_id(s) or 0 for s in MARKERS}
    grammars = Grammars(marked_tokenizer, marked_tokenizer.get_vocab_size(), (4,))
    grammar = grammars.compile(TOOL_FORMATS[form].forced(FUNCTIONS, True, ids))
    tokens = marked_tokenizer.encode(call, add_special_tokens=False).ids
    guide = grammar.guide()
    for token in tokens:
        assert guide.allowed()[token], marked_tokenizer.decode(tokens[:tokens.index(token) + 1])
        guide.consume(token)
    assert guide.matcher.is_accepting()
    other = grammar.guide()
    wrong = marked_tokenizer.encode('{"name": "nope"', add_special_tokens=False).ids
    assert not all(other.matcher.consume_token(t) for t in wrong)


def test_phi4_mini_gets_its_tools_in_the_system_message() -> None:
    """Its template reads a system message's "tools" (JSON text), so the functions go there, as a list."""
    form = TOOL_FORMATS["phi4_mini"]
    for messages in (ASK, [{"role": "system", "content": "Be brief."}, *ASK]):
        placed = form.place_tools(list(messages), TOOLS)
        text = ChatTemplate(PHI4_MINI_TEMPLATE, {"eos_token": "<|endoftext|>"}).render(placed, True, TOOLS)
        assert text.startswith(f"<|system|>{messages[0]['content'] if len(messages) > 1 else ''}<|tool|>")
        assert json.loads(text.split("<|tool|>")[1].split("<|/tool|>")[0]) == FUNCTIONS
        assert text.endswith("<|user|>Weather in Paris, and the time?<|end|><|assistant|>")
    assert TOOL_FORMATS["hermes"].place_tools(list(ASK), TOOLS) == ASK


@pytest.fixture(scope="module")
def client(tiny_llm_build: Path) -> Iterator[TestClient]:
    with serving(tiny_llm_build / "model") as test_client:
        yield test_client


def ask(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "max_tokens": 120,
                                                          "temperature": 0, **body})
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def check_calls(calls: list[dict[str, Any]]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]])


def test_required_and_named_choices_give_calls_that_match_the_schemas(client: TestClient) -> None:
    for seed in range(3):
        choice = ask(client, tool_choice="required", temperature=1, seed=seed)
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        check_calls(choice["message"]["tool_calls"])
    named = ask(client, tool_choice={"type": "function", "function": {"name": "time"}})
    assert [c["function"]["name"] for c in named["message"]["tool_calls"]] == ["time"]


def test_streamed_tool_call_deltas_add_up_to_the_whole_answer(client: TestClient) -> None:
    whole = ask(client, tool_choice="required")
    chunks = sse(client, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "max_tokens": 120,
                                                  "temperature": 0, "tool_choice": "required", "stream": True})
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk["choices"][0]["delta"].get("tool_calls", []):
            call = calls.setdefault(delta["index"], {"name": "", "arguments": ""})
            call["name"] += delta.get("function", {}).get("name", "")
            call["arguments"] += delta["function"].get("arguments", "")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert list(calls.values()) == [{k: c["function"][k] for k in ("name", "arguments")}
                                    for c in whole["message"]["tool_calls"]]


def test_a_round_trip_sends_results_back_and_gets_an_answer(client: TestClient) -> None:
    first = ask(client, tool_choice="required")
    results = [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": c["function"]["name"]})}
               for c in first["message"]["tool_calls"]]
    final = ask(client, messages=[*ASK, first["message"], *results], tool_choice="none", max_tokens=16)
    assert final["finish_reason"] == "length" and final["message"]["content"]
    assert "tool_calls" not in final["message"]


def test_auto_without_a_call_is_plain_content(client: TestClient) -> None:
    choice = ask(client, max_tokens=12)  # the tiny model answers in prose
    assert choice["message"]["content"] and choice["finish_reason"] == "length"


@pytest.mark.parametrize(("body", "code"), [
    ({"tool_choice": "required"}, "invalid_tools"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "invalid_tools"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "conflicting_constraints"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "invalid_request"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "invalid_request"),
])
def test_tool_requests_that_cannot_work_are_400s(client: TestClient, body: dict[str, Any], code: str) -> None:
    response = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    assert (response.status_code, response.json()["error"]["code"]) == (400, code), response.text


def test_a_model_without_a_tool_format_refuses_tools(tiny_llm_build: Path) -> None:
    with serving(tiny_llm_build / "model", tool_call_parser="none") as client:
        response = client.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "max_tokens": 4})
        assert (response.status_code, response.json()["error"]["code"]) == (400, "tools_unsupported")
        assert "MBUILD_TOOL_CALL_PARSER" in response.json()["error"]["message"]


CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}


@pytest.mark.parametrize(("body", "code", "words"), [
    ({"tools": [*TOOLS, {"type": "function", "function": {"name": "weather", "parameters": ZONE}}]},
     "invalid_tools", "'weather'"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "none"}, "invalid_tools", "'weather'"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_404", "content": "{}"}]}, "invalid_messages",
     "call_404"),
    ({"messages": [*ASK, CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "{}"}]}, "invalid_messages",
     "call_2"),
    ({"messages": [*ASK, CALLED, {"role": "tool", "content": "{}"}]}, "invalid_messages", "tool_call_id"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "{}"}, CALLED, *ASK]}, "invalid_messages",
     "messages[0]"),  # a result before its call
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "invalid_request", "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": "false"}, "invalid_request",
     "parallel_tool_calls"),
])
def test_tool_requests_openai_refuses_are_400s_that_say_why(client: TestClient, body: dict[str, Any], code: str,
                                                            words: str) -> None:
    response = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, code), response.text
    assert words in error["message"], error["message"]


def test_a_tool_result_answering_an_earlier_call_is_taken(client: TestClient) -> None:
    result = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 20}'}
    choice = ask(client, messages=[*ASK, CALLED, result], tool_choice="none", max_tokens=4)
    assert choice["message"]["content"]
