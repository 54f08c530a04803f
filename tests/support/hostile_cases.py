"""The hostile-input corpus (issue 13): cases the bad-input corpus of
tests/integration/test_reliability.py does not hold.

Expected statuses follow docs/api.md: the caller's mistakes are 4xx with a JSON error, never 5xx. A
tuple of statuses means "either is a fair answer" (a 200 then must be a complete, correct answer); a case
with `names` must name the field at fault in its error message.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.corpus import Case, j, noauth

V2 = "/v2/models/{model}/infer"
BIG = 10**30
SURROGATE = "\ud800"  # json.dumps writes the escape "\ud800": valid JSON, not valid Unicode
DEEP = b"[" * 100_000 + b"]" * 100_000
DIGITS = b"9" * 5000  # past Python's 4300-digit int limit
MSG = [{"role": "user", "content": "Hello"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def raw(**fields: Any) -> bytes:
    """A JSON body whose values may hold raw JSON text (bytes), e.g. 100k nested lists or 5000 digits."""
    parts = [json.dumps(k).encode() + b":" + (v if isinstance(v, bytes) else json.dumps(v).encode())
             for k, v in fields.items()]
    return b"{" + b",".join(parts) + b"}"


def text(name: str, data: list[Any], shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "BYTES", "shape": [len(data)] if shape is None else shape, "data": data,
            **extra}


def v2(inputs: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"inputs": inputs, **fields}


def header(value: bytes) -> tuple[tuple[str, str | bytes], ...]:
    return (("Authorization", "Bearer reliability-key"), ("Inference-Header-Content-Length", value))


TXT = [text("text", ["hello"])]
TXT_IN = [text("text_input", ["hello"])]
ROUTES_401 = ["/v1/models", "/v1/metadata", "/docs", "/openapi.json", "/v2", "/v2/models/{model}"]
HEALTH = ["/v1/health/live", "/v1/health/ready", "/health", "/v2/health/live", "/v2/health/ready",
          "/v2/models/{model}/ready"]


def metadata_cases(tag: str) -> list[Case]:
    """With MBUILD_API_KEY set, what describes the service needs the key; health never does."""
    cases = [noauth(Case(f"{tag}: GET {p} without a key", p, None, 401, "GET")) for p in ROUTES_401]
    cases += [Case(f"{tag}: GET {p} with a wrong key", p, None, 401, "GET", (("Authorization", "Bearer nope"),))
              for p in ROUTES_401[:2]]
    cases += [noauth(Case(f"{tag}: GET {p} without a key", p, None, 200, "GET")) for p in HEALTH]
    cases += [Case(f"{tag}: POST /v1/models", "/v1/models", j(), 405),
              Case(f"{tag}: GET /v2/models/<unknown>", "/v2/models/nobody%ED%A0%80", None, 404, "GET"),
              Case(f"{tag}: GET a 10k-character model name", "/v2/models/" + "m" * 10_000, None, 404, "GET")]
    return cases


ENCODER_CASES = [
    Case("emb: 100k nested lists as input", "/v1/embeddings", raw(input=DEEP), 400),
    Case("emb: 100k nested lists as the body", "/v1/embeddings", DEEP, 400),
    Case("emb: a 5000-digit dimensions", "/v1/embeddings", raw(input="a", dimensions=DIGITS), 400),
    Case("emb: dimensions 10**30", "/v1/embeddings", j(input="a", dimensions=BIG), 400),
    Case("emb: dimensions NaN", "/v1/embeddings", raw(input="a", dimensions=b"NaN"), 400),
    Case("emb: lone surrogate in input", "/v1/embeddings", j(input=f"a{SURROGATE}b"), 400),
    Case("emb: lone surrogate in an input list", "/v1/embeddings", j(input=["ok", SURROGATE]), 400),
    Case("emb: lone surrogate in model", "/v1/embeddings", j(input="a", model=SURROGATE), (400, 404)),
    Case("emb: lone surrogate in user", "/v1/embeddings", j(input="a", user=SURROGATE), 400),
    Case("emb: lone surrogate in truncate", "/v1/embeddings", j(input="a", truncate=SURROGATE), 400),
    Case("emb: input of 100k token ids", "/v1/embeddings", j(input=list(range(100_000))), 400),
    Case("emb: truncate a list", "/v1/embeddings", j(input="a", truncate=["END"]), 400),
    Case("v2 emb: 100k nested lists", V2, raw(inputs=DEEP), 400),
    Case("v2 emb: a 5000-digit shape", V2, raw(inputs=b'[{"name":"text","datatype":"BYTES","shape":[' + DIGITS +
                                            b'],"data":["a"]}]'), 400),
    Case("v2 emb: shape [2**40, 2**40], no data", V2, v2([text("text", [], [2**40, 2**40])]), 400),
    Case("v2 emb: shape [2**40, 2**40], one text", V2, v2([text("text", ["a"], [2**40, 2**40])]), 400),
    Case("v2 emb: shape [2**62, 4]", V2, v2([text("text", [], [2**62, 4])]), 400),
    Case("v2 emb: shape [10**30]", V2, v2([text("text", ["a"], [BIG])]), 400),
    Case("v2 emb: parameters a list", V2, v2(TXT, parameters=["truncate", "END"]), 400),
    Case("v2 emb: parameters a string", V2, v2(TXT, parameters="truncate=END"), 400),
    Case("v2 emb: parameters null (as if absent)", V2, v2(TXT, parameters=None), 200),
    Case("v2 emb: parameters nested", V2, v2(TXT, parameters={"truncate": {"mode": "END"}}), 400),
    Case("v2 emb: parameters a number", V2, v2(TXT, parameters=5), 400),
    Case("v2 emb: input parameters a string", V2, v2([text("text", ["a"], parameters="binary")]), 400),
    Case("v2 emb: input parameters a list", V2, v2([text("text", ["a"], parameters=[1])]), 400),
    Case("v2 emb: binary_data_size 10**30", V2, v2([text("text", ["a"], parameters={"binary_data_size": BIG})]),
         400),
    Case("v2 emb: output parameters a string", V2, v2(TXT, outputs=[{"name": "embedding", "parameters": "bin"}]),
         400),
    Case("v2 emb: lone surrogate in BYTES data", V2, v2([text("text", [SURROGATE])]), 400),
    Case("v2 emb: lone surrogate in id", V2, v2(TXT, id=SURROGATE), 400),
    Case("v2 emb: lone surrogate in an input name", V2, v2([text(SURROGATE, ["a"])]), 400),
    Case("v2 emb: 10k texts", V2, v2([text("text", ["hello"] * 10_000)]), 400),
    Case("v2 emb: input_ids 10**30", V2, v2([
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [BIG]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 1], "data": [1]}]), 400),
    Case("v2 emb: Inference-Header-Content-Length '²'", V2, json.dumps(v2(TXT)).encode(), 400,
         headers=header("²".encode("latin-1"))),
    Case("v2 emb: Inference-Header-Content-Length '١٢'", V2, json.dumps(v2(TXT)).encode(), 400,
         headers=header("١٢".encode())),
    *metadata_cases("encoder"),
]

UNIMPLEMENTED = {"best_of": 2, "top_logprobs": 3, "guided_decoding_backend": "xgrammar",
                 "nvext": {"top_k": 5}}
NESTED_SCHEMA: dict[str, object] = {"type": "object"}
for _ in range(150):
    NESTED_SCHEMA = {"type": "object", "properties": {"a": NESTED_SCHEMA}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
OTHER_F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["x"],
                                                                       "properties": {"x": {"type": "integer"}}}}}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
NESTED_GROUPS = "(" * 40 + "a" + "){2}" * 40  # compiles, then its lexer cannot take the first byte
# A JSON boolean or number sent as another type: pydantic's lax mode took "yes" as true, "8" as 8, true as 1.
MISTYPED = {"stream": "false", "logprobs": 1, "parallel_tool_calls": "yes", "skip_special_tokens": "no",
            "ignore_eos": "true", "max_tokens": "8", "n": True, "temperature": "0.5",
            "stream_options": {"include_usage": "yes"}, "speculative": "no"}
STRUCTURED_AND_TOOL_CASES = [
    Case("chat: guided_json oneOf (overlapping options)", CHAT,
         j(messages=MSG, max_tokens=4, guided_json={"oneOf": [{"type": "integer"}, {"type": "number"}]}), 400,
         names="'anyOf'"),
    Case("chat: guided_regex of 40 nested counted groups", CHAT, j(messages=MSG, max_tokens=4,
                                                                     guided_regex=NESTED_GROUPS), 400,
         names="guided_regex"),
    Case("chat: guided_regex of 40 nested counted groups, streamed", CHAT,
         j(messages=MSG, max_tokens=4, guided_regex=NESTED_GROUPS, stream=True), 400, names="guided_regex"),
    Case("chat: guided_regex a{1000}{1000}", CHAT, j(messages=MSG, max_tokens=4, guided_regex="a{1000}{1000}"),
         400, names="guided_regex"),
    Case("chat: response_format pattern of 40 nested counted groups", CHAT, j(
        messages=MSG, max_tokens=4, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": f"^{NESTED_GROUPS}$"}}}), 400,
         names="response_format"),
    Case("chat: guided_json nested 150 deep", CHAT, j(messages=MSG, max_tokens=4, guided_json=NESTED_SCHEMA), 400),
    Case("chat: two tools named f", CHAT, j(messages=MSG, max_tokens=4, tools=[TOOL, OTHER_F]), 400, names="'f'"),
    Case("chat: a tool result for a call never made", CHAT,
         j(messages=[*MSG, {"role": "tool", "tool_call_id": "call_9", "content": "{}"}], max_tokens=4), 400,
         names="call_9"),
    Case("chat: a tool result without tool_call_id", CHAT,
         j(messages=[*MSG, CALL, {"role": "tool", "content": "{}"}], max_tokens=4), 400, names="tool_call_id"),
    Case("chat: a tool result for an earlier call", CHAT,
         j(messages=[*MSG, CALL, {"role": "tool", "tool_call_id": "call_1", "content": "{}"}], max_tokens=4), 200),
    *[Case(f"chat: {k} {v!r}", CHAT, {**j(messages=MSG, max_tokens=4, tools=[TOOL]), k: v}, 400, names=k)
      for k, v in MISTYPED.items()],
    Case("cmpl: echo 'true'", COMPLETIONS, j(prompt="a", max_tokens=4, echo="true"), 400, names="echo"),
    Case("cmpl: logprobs true", COMPLETIONS, j(prompt="a", max_tokens=4, logprobs=True), 400, names="logprobs"),
]
# The reasoning fields (tests/unit/runtimes/generation/test_reasoning.py): bounded, of their JSON type, and refused
# with their name.
THOUGHT_BACK = {"role": "assistant", "content": "Hi", "reasoning_content": "I greet back."}
REASONING_CASES = [
    Case("chat: include_reasoning 'no'", CHAT, j(messages=MSG, max_tokens=4, include_reasoning="no"), 400,
         names="include_reasoning"),
    Case("chat: include_reasoning false", CHAT, j(messages=MSG, max_tokens=4, include_reasoning=False), 200),
    Case("chat: reasoning_effort 'extreme'", CHAT, j(messages=MSG, max_tokens=4, reasoning_effort="extreme"), 400,
         names="reasoning_effort"),
    Case("chat: reasoning_effort 3", CHAT, j(messages=MSG, max_tokens=4, reasoning_effort=3), 400,
         names="reasoning_effort"),
    Case("chat: reasoning_effort low (the template's variable)", CHAT,
         j(messages=MSG, max_tokens=4, reasoning_effort="low"), 200),
    Case("chat: chat_template_kwargs a list", CHAT, j(messages=MSG, max_tokens=4, chat_template_kwargs=["a"]), 400,
         names="chat_template_kwargs"),
    Case("chat: chat_template_kwargs of 100k keys", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={f"k{i}": True for i in range(100_000)}), 400,
         names="chat_template_kwargs"),
    Case("chat: chat_template_kwargs a nested value", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"enable_thinking": {"a": [1]}}), 400,
         names="enable_thinking"),
    Case("chat: chat_template_kwargs a 100k-character text", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"note": "x" * 100_000}), 400, names="note"),
    Case("chat: chat_template_kwargs overriding messages", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"messages": []}), 400, names="messages"),
    Case("chat: chat_template_kwargs overriding eos_token", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"eos_token": "x"}), 400, names="eos_token"),
    Case("chat: chat_template_kwargs with a lone surrogate key", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={SURROGATE: True}), 400),
    Case("chat: chat_template_kwargs enable_thinking false", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"enable_thinking": False}), 200),
    Case("chat: chat_template_kwargs hiding jinja's namespace() (Qwen3's template calls it)", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"namespace": 1}), 400, names="namespace"),
    Case("chat: chat_template_kwargs hiding jinja's range()", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"range": "x"}), 400, names="range"),
    Case("chat: chat_template_kwargs named self (render's own argument)", CHAT,
         j(messages=MSG, max_tokens=4, chat_template_kwargs={"self": 1}), 200),
    Case("chat: reasoning_effort twice, as the field and a template variable", CHAT,
         j(messages=MSG, max_tokens=4, reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"}),
         400, names="reasoning_effort"),
    Case("chat: reasoning_content sent back", CHAT, j(messages=[*MSG, THOUGHT_BACK, *MSG], max_tokens=4), 200),
    Case("chat: reasoning_content a number", CHAT,
         j(messages=[*MSG, {**THOUGHT_BACK, "reasoning_content": 5}, *MSG], max_tokens=4), 400,
         names="reasoning_content"),
    Case("chat: lone surrogate in reasoning_content", CHAT,
         j(messages=[*MSG, {**THOUGHT_BACK, "reasoning_content": SURROGATE}, *MSG], max_tokens=4), 400),
]
LLM_CASES = [
    Case("chat: 100k nested lists as content", CHAT, raw(messages=b'[{"role":"user","content":' + DEEP + b"}]"),
         400),
    Case("chat: a 5000-digit max_tokens", CHAT, raw(messages=MSG, max_tokens=DIGITS), 400),
    Case("chat: max_tokens 10**30", CHAT, j(messages=MSG, max_tokens=BIG), 400),
    Case("chat: max_completion_tokens 10**30", CHAT, j(messages=MSG, max_completion_tokens=BIG), 400),
    Case("chat: n 10**30", CHAT, j(messages=MSG, n=BIG), 400),
    Case("chat: top_k 10**30", CHAT, j(messages=MSG, max_tokens=4, top_k=BIG), 400),
    Case("chat: stop_token_ids [10**30]", CHAT, j(messages=MSG, max_tokens=4, stop_token_ids=[BIG]), 400),
    Case("chat: temperature NaN", CHAT, raw(messages=MSG, temperature=b"NaN"), 400),
    Case("chat: top_p NaN", CHAT, raw(messages=MSG, top_p=b"NaN"), 400),
    Case("chat: presence_penalty Infinity", CHAT, raw(messages=MSG, presence_penalty=b"Infinity"), 400),
    Case("chat: lone surrogate in content", CHAT, j(messages=[{"role": "user", "content": SURROGATE}]), 400),
    Case("chat: lone surrogate in a text part", CHAT,
         j(messages=[{"role": "user", "content": [{"type": "text", "text": f"hi {SURROGATE}"}]}]), 400),
    Case("chat: lone surrogate in stop", CHAT, j(messages=MSG, max_tokens=4, stop=[SURROGATE]), 400),
    Case("chat: lone surrogate in model", CHAT, j(messages=MSG, model=SURROGATE), (400, 404)),
    Case("chat: lone surrogate in user", CHAT, j(messages=MSG, max_tokens=4, user=SURROGATE), 400),
    Case("chat: lone surrogate in a message name", CHAT,
         j(messages=[{"role": "user", "content": "hi", "name": SURROGATE}], max_tokens=4), 400),
    Case("chat: 100k messages", CHAT, j(messages=[{"role": "user", "content": "a"}] * 100_000), 400),
    Case("chat: 100k stop_token_ids", CHAT, j(messages=MSG, max_tokens=4, stop_token_ids=[7] * 100_000), 400),
    Case("chat: 1000 stop strings", CHAT, j(messages=MSG, stop=[f"s{i}" for i in range(1000)]), 400),
    Case("chat: logit_bias with 100k keys", CHAT, j(messages=MSG, logit_bias={str(i): 1 for i in range(100_000)}),
         400, names="logit_bias"),
    Case("chat: stream_options a string", CHAT, j(messages=MSG, stream=True, stream_options="usage"), 400),
    Case("chat: messages items numbers", CHAT, j(messages=[1, 2, 3]), 400),
    Case("chat: response_format a list", CHAT, j(messages=MSG, response_format=["text"]), 400),
    Case("chat: tools a string", CHAT, j(messages=MSG, tools="get_weather"), 400),
    Case("chat: n 2 with a seed", CHAT, j(messages=MSG, max_tokens=4, n=2, seed=7), 200),
    *[Case(f"chat: seed {s} (any 64-bit seed)", CHAT, j(messages=MSG, max_tokens=4, seed=s), 200)
      for s in (-1, -2**63, 2**64 - 1)],
    *[Case(f"chat: seed {s} (beyond 64 bits)", CHAT, j(messages=MSG, max_tokens=4, seed=s), 400, names="seed")
      for s in (2**64, BIG)],
    Case("chat: seed -1, streamed", CHAT, j(messages=MSG, max_tokens=4, seed=-1, stream=True), 200),
    *[Case(f"chat: {k} (not implemented)", CHAT, j(messages=MSG, **{k: v}), 400, names=k)
      for k, v in UNIMPLEMENTED.items()],
    Case("cmpl: 100k nested lists as prompt", COMPLETIONS, raw(prompt=DEEP), 400),
    Case("cmpl: a 5000-digit token id", COMPLETIONS, raw(prompt=b"[" + DIGITS + b"]"), 400),
    Case("cmpl: token id 10**30", COMPLETIONS, j(prompt=[BIG]), 400),
    Case("cmpl: max_tokens 10**30", COMPLETIONS, j(prompt="a", max_tokens=BIG), 400),
    Case("cmpl: n 10**30", COMPLETIONS, j(prompt="a", n=BIG), 400),
    Case("cmpl: top_k 10**30", COMPLETIONS, j(prompt="a", max_tokens=4, top_k=BIG), 400),
    Case("cmpl: lone surrogate in prompt", COMPLETIONS, j(prompt=f"x{SURROGATE}"), 400),
    Case("cmpl: lone surrogate in a prompt list", COMPLETIONS, j(prompt=["ok", SURROGATE]), 400),
    Case("cmpl: lone surrogate in stop", COMPLETIONS, j(prompt="a", max_tokens=4, stop=SURROGATE), 400),
    Case("cmpl: 10k prompts", COMPLETIONS, j(prompt=["hello"] * 10_000, max_tokens=4), 400),
    Case("cmpl: 10k token-id prompts", COMPLETIONS, j(prompt=[[5, 6]] * 10_000, max_tokens=4), 400),
    Case("cmpl: stream_options a string", COMPLETIONS, j(prompt="a", stream=True, stream_options="yes"), 400),
    *[Case(f"cmpl: seed {s} (any 64-bit seed)", COMPLETIONS, j(prompt="a", max_tokens=4, seed=s), 200)
      for s in (-1, -2**63, 2**64 - 1)],
    *[Case(f"cmpl: seed {s} (beyond 64 bits)", COMPLETIONS, j(prompt="a", max_tokens=4, seed=s), 400, names="seed")
      for s in (2**64, BIG)],
    Case("cmpl: seed -1, streamed", COMPLETIONS, j(prompt="a", max_tokens=4, seed=-1, stream=True), 200),
    Case("cmpl: n 2 with a seed", COMPLETIONS, j(prompt="a", max_tokens=4, n=2, seed=3), 200),
    Case("cmpl: suffix (not implemented)", COMPLETIONS, j(prompt="a", suffix="b"), 400, names="suffix"),
    Case("cmpl: best_of (not implemented)", COMPLETIONS, j(prompt="a", best_of=3), 400, names="best_of"),
    Case("cmpl: logit_bias, applied as OpenAI does", COMPLETIONS, j(prompt="a", logit_bias={"1": 5}), 200),
    Case("cmpl: logit_bias on a token id outside the vocabulary", COMPLETIONS,
         j(prompt="a", logit_bias={str(10**15): 5}), 400),
    Case("v2 llm: lone surrogate in text_input", V2, v2([text("text_input", [SURROGATE])]), 400),
    Case("v2 llm: lone surrogate in id", V2, v2(TXT_IN, id=SURROGATE), 400),
    Case("v2 llm: max_tokens 10**30", V2, v2([*TXT_IN, {"name": "max_tokens", "datatype": "INT32", "shape": [1],
                                                        "data": [BIG]}]), 400),
    Case("v2 llm: parameters a string", V2, v2(TXT_IN, parameters="hot"), 400),
    Case("v2 llm: parameters a number", V2, v2(TXT_IN, parameters=5), 400),
    Case("v2 llm: parameters nested", V2, v2(TXT_IN, parameters={"temperature": {"value": 1}}), 400),
    Case("v2 llm: input parameters a list", V2, v2([text("text_input", ["a"], parameters=[1])]), 400),
    Case("v2 llm: shape [2**40, 2**40]", V2, v2([text("text_input", [], [2**40, 2**40])]), 400),
    Case("v2 llm: 10k texts", V2, v2([text("text_input", ["hello"] * 10_000)]), 400),
    Case("v2 llm: 300 rows, more than the queue ever holds (was a 429 forever)", V2,
         v2([text("text_input", ["hello"] * 300)]), 400, names="MBUILD_MAX_QUEUE"),
    Case("v2 llm: 100k nested lists", V2, raw(inputs=DEEP), 400),
    Case("v2 llm: Inference-Header-Content-Length '١٢'", V2, json.dumps(v2(TXT_IN)).encode(), 400,
         headers=header("١٢".encode())),
    *STRUCTURED_AND_TOOL_CASES,
    *REASONING_CASES,
    *metadata_cases("llm"),
]
