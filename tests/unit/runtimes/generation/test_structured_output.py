"""Structured output served in-process by the real engine on the tiny Llama: every constrained answer parses and
validates, whatever the sampler draws, and a constraint the server cannot compile is a 400 naming the field."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer, models

from runtimes.generation.guided import Grammars, GuideError, GuideSpec
from tests.unit.runtimes.api.test_generation_service import serving, sse

ASK = [{"role": "user", "content": "Describe the weather as JSON"}]
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "temp", "sunny", "tags"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "temp": {"type": "integer", "minimum": -40, "maximum": 50},
                          "sunny": {"type": "boolean"},
                          "tags": {"type": "array", "items": {"enum": ["dry", "wet", "windy"]}, "maxItems": 3}}}


@pytest.fixture(scope="module")
def client(tiny_llm_build: Path) -> Iterator[TestClient]:
    with serving(tiny_llm_build / "model") as test_client:
        yield test_client


def contents(client: TestClient, **body: Any) -> list[str]:
    response = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 120, **body})
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert all(c["finish_reason"] == "stop" for c in choices), choices  # the grammar ended it, not max_tokens
    return [c["message"]["content"] for c in choices]


def test_json_schema_answers_validate_on_20_samples_at_temperature_1(client: TestClient) -> None:
    form = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    answers = [a for seed in range(5) for a in contents(client, response_format=form, n=4, temperature=1, seed=seed)]
    assert len(answers) == 20
    for answer in answers:
        jsonschema.validate(json.loads(answer), WEATHER)
    assert len(set(answers)) > 1  # sampled, not one forced string


@pytest.mark.parametrize(("field", "check"), [
    ({"guided_choice": ["sunny", "rainy", "snow"]}, lambda a: a in ("sunny", "rainy", "snow")),
    ({"guided_regex": r"[a-z]{2,5}-[0-9]{3}"}, lambda a: re.fullmatch(r"[a-z]{2,5}-[0-9]{3}", a)),
    ({"nvext": {"guided_json": WEATHER}}, lambda a: jsonschema.validate(json.loads(a), WEATHER) is None),
    ({"guided_json": json.dumps(WEATHER)}, lambda a: jsonschema.validate(json.loads(a), WEATHER) is None),
    ({"guided_grammar": 'start: "yes" | "no" " " NUM\nNUM: /[0-9]{2}/'}, lambda a: re.fullmatch(r"yes|no \d\d", a)),
])
def test_each_way_of_asking_constrains_every_sample(client: TestClient, field: dict[str, Any], check: Any) -> None:
    for answer in contents(client, temperature=1, n=3, seed=7, **field):
        assert check(answer), answer


def test_json_object_is_an_object(client: TestClient) -> None:
    """Any object: its keys are free text, so a sample may run to max_tokens; each one that ends is an object."""
    response = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 60, "temperature": 1, "n": 8,
                                                          "seed": 7, "response_format": {"type": "json_object"}})
    choices = response.json()["choices"]
    ended = [c["message"]["content"] for c in choices if c["finish_reason"] == "stop"]
    assert ended and all(isinstance(json.loads(answer), dict) for answer in ended)
    assert all(c["message"]["content"].startswith("{") for c in choices)


def test_completions_route_takes_the_same_constraints(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "The weather:", "max_tokens": 40, "temperature": 1,
                                                    "guided_regex": "(hot|cold) and (dry|wet)"})
    assert response.status_code == 200, response.text
    assert re.fullmatch("(hot|cold) and (dry|wet)", response.json()["choices"][0]["text"])


def test_streamed_constrained_answer_equals_the_whole_one(client: TestClient) -> None:
    body = {"messages": ASK, "max_tokens": 120, "temperature": 0, "guided_json": WEATHER}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    chunks = sse(client, "/v1/chat/completions", {**body, "stream": True})
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == whole and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_constrained_sequence_leaves_its_batch_neighbours_alone(client: TestClient) -> None:
    """One request's mask applies to its own row: a free request decodes the same beside a constrained one."""
    free = {"messages": ASK, "max_tokens": 24, "temperature": 0}
    alone = client.post("/v1/chat/completions", json=free).json()["choices"][0]["message"]["content"]
    with ThreadPoolExecutor(4) as pool:
        guided = [pool.submit(client.post, "/v1/chat/completions",
                              json={**free, "max_tokens": 120, "guided_json": WEATHER, "temperature": 1, "n": 3})
                  for _ in range(2)]
        beside = [pool.submit(client.post, "/v1/chat/completions", json=free) for _ in range(2)]
        for future in beside:
            assert future.result().json()["choices"][0]["message"]["content"] == alone
        for future in guided:
            for choice in future.result().json()["choices"]:
                jsonschema.validate(json.loads(choice["message"]["content"]), WEATHER)


NESTED = "(" * 40 + "a" + "){2}" * 40  # 40 nested groups: 2**40 a's, whose lexer cannot take its first byte


@pytest.mark.parametrize(("body", "code", "named"), [
    ({"guided_regex": "[a-"}, "invalid_constraint", "guided_regex"),
    ({"guided_json": {"type": "bogus"}}, "invalid_constraint", "guided_json"),
    ({"guided_json": "{not json"}, "invalid_guided_json", "guided_json"),
    ({"guided_grammar": "start: undefined_rule"}, "invalid_constraint", "guided_grammar"),
    ({"guided_json": {"$ref": "#"}}, "invalid_constraint", "matches no output"),
    ({"guided_json": {"$ref": "http://169.254.169.254/latest"}}, "invalid_constraint", "guided_json"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "conflicting_constraints", "guided_choice"),
    ({"response_format": {"type": "json_object"}, "nvext": {"guided_regex": "a"}}, "conflicting_constraints",
     "nvext.guided_regex"),
    ({"response_format": {"type": "json_schema"}}, "invalid_response_format", "json_schema"),
    ({"response_format": {"type": "yaml"}}, "invalid_request", "response_format"),
    ({"nvext": {"guided_decoding_backend": "x"}}, "invalid_request", "guided_decoding_backend"),
    ({"guided_choice": []}, "invalid_request", "guided_choice"),
    ({"guided_json": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "invalid_constraint", "'anyOf'"),
    ({"guided_regex": NESTED}, "invalid_constraint", "guided_regex"),
    ({"guided_regex": "a{1000}{1000}"}, "invalid_constraint", "simplify"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": f"^{NESTED}$"}}}}, "invalid_constraint", "response_format"),
])
def test_constraints_that_cannot_work_are_400s_naming_the_field(client: TestClient, body: dict[str, Any], code: str,
                                                                named: str) -> None:
    response = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 8, **body})
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, code), response.text
    assert named in error["message"] and "coerce_one_of" not in error["message"]
    assert client.get("/v1/health/ready").status_code == 200


@pytest.mark.parametrize("regex", [NESTED, "a{1000}{1000}"])
def test_a_grammar_that_fails_at_its_first_bytes_is_refused_before_the_stream_starts(client: TestClient,
                                                                                     regex: str) -> None:
    """Found when the grammar is compiled, so a streamed request gets a 400, not a 200 whose stream then fails."""
    body = {"messages": ASK, "max_tokens": 8, "guided_regex": regex, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.read()
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_constraint"


def test_a_grammar_too_costly_to_follow_fails_its_request_alone(client: TestClient) -> None:
    """A grammar whose lexer outgrows the parser's bounds only past the tokens compiling it follows (here at its
    second property) ends its own request with a 400 (stream: an error event); a request beside it decodes as it
    would alone."""
    free = {"messages": ASK, "max_tokens": 24, "temperature": 0}
    alone = client.post("/v1/chat/completions", json=free).json()["choices"][0]["message"]["content"]
    late = {"type": "object", "required": ["a", "b"], "additionalProperties": False, "properties": {
        "a": {"type": "string", "minLength": 30, "maxLength": 30}, "b": {"type": "string", "pattern": f"^{NESTED}$"}}}
    hostile = {**free, "max_tokens": 100, "guided_json": late}
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(client.post, "/v1/chat/completions", json=free)
        refused = client.post("/v1/chat/completions", json=hostile)
        assert beside.result().json()["choices"][0]["message"]["content"] == alone
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "constraint_failed"), refused.text
    assert "simplify the output constraint" in refused.json()["error"]["message"]
    with client.stream("POST", "/v1/chat/completions", json={**hostile, "stream": True}) as response:
        last = [line for line in response.iter_lines() if line.startswith("data: ")][-1]
    assert json.loads(last[6:])["error"]["code"] == "constraint_failed"


def test_a_tokenizer_the_grammar_engine_cannot_read_refuses_constraints_only() -> None:
    """A word-level vocabulary has no byte decoder for llguidance: the model still loads and serves free text;
    a constrained request gets a 400 that says why."""
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(50)}, unk_token="t0"))
    grammars = Grammars(tokenizer, 50, (2,))  # no error at load
    with pytest.raises(GuideError, match="cannot read this model's tokenizer"):
        grammars.compile(GuideSpec("json_object", None))


def test_refused_constraints_give_their_memory_back(tiny_llama: Path) -> None:
    """A constraint refused at its lexer's bounds takes tens of MB first; the server's memory must not read as grown
    by each one (glibc kept them: +60 MB over these 40 refusals before the trim)."""
    tokenizer = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    grammars = Grammars(tokenizer, tokenizer.get_vocab_size(), (2,))
    grammars.compile('%llguidance {}\nstart: "x"')  # the vocabulary as llguidance reads it, made once

    def resident_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    before = resident_mb()
    for i in range(20):  # each text once: a refused grammar is never cached
        for pattern in (NESTED, "a{1000}{1000}"):
            with pytest.raises(GuideError, match="too costly to follow"):
                grammars.compile(f'%llguidance {{}}\nstart: /{pattern}{"b" * i}/')
    assert resident_mb() - before < 15
