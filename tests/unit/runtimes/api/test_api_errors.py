"""A failed generation answers one error body whether it is asked for whole (a JSON error) or streamed (the last
SSE event), served in-process by the real engine on a tiny Llama."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from runtimes.engines.step import StepOutput, Work
from tests.unit.runtimes.api.test_generation_service import client
from tests.unit.runtimes.generation.test_structured_output import NESTED

__all__ = ["client"]  # the module-scoped service fixture, shared
ASK = {"messages": [{"role": "user", "content": "Hello, how are you"}], "max_tokens": 8, "temperature": 0}


def last_event(client: TestClient, body: dict[str, Any]) -> Any:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200  # the stream had begun: the failure can only be told inside it
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert "data: [DONE]" not in lines
    return json.loads(lines[-1][6:])


def test_a_constraint_that_cannot_go_on_reads_the_same_whole_or_streamed(client: TestClient) -> None:
    # Its lexer outgrows the parser's bounds only at the second property, past what compiling follows, so the
    # request is admitted and fails mid-generation (a pattern that fails at once is refused before admission).
    late = {"type": "object", "required": ["a", "b"], "additionalProperties": False, "properties": {
        "a": {"type": "string", "minLength": 30, "maxLength": 30}, "b": {"type": "string", "pattern": f"^{NESTED}$"}}}
    hostile = {**ASK, "max_tokens": 100, "guided_json": late}
    whole = client.post("/v1/chat/completions", json=hostile)
    assert whole.status_code == 400, whole.text
    assert whole.json()["error"]["type"] == "invalid_request_error"
    assert whole.json()["error"]["code"] == "constraint_failed"
    assert "simplify the output constraint" in whole.json()["error"]["message"]
    # Where the grammar gives out can differ by run (sampling is greedy, but the 30-character string's tokens are
    # not fixed by the schema); the body around it is the same.
    assert at_token(last_event(client, hostile)) == at_token(whole.json())


def at_token(body: Any) -> Any:
    message = re.sub(r"at token \d+", "at token N", body["error"]["message"])
    return {**body, "error": {**body["error"], "message": message}}


def test_an_engine_failure_reads_the_same_whole_or_streamed(client: TestClient,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(works: list[Work]) -> StepOutput:  # as the engine reports a failed run: per work
        return StepOutput({}, {work.slot: RuntimeError("the device went away") for work in works})

    app = client.app
    assert isinstance(app, FastAPI)
    monkeypatch.setattr(app.state.service.generation.engine, "step", broken)
    whole = client.post("/v1/chat/completions", json=ASK)
    assert whole.status_code == 500, whole.text
    assert whole.json() == {"error": {"message": "generation failed: prefill failed: the device went away",
                                      "type": "server_error", "code": "generation_failed"}}
    assert last_event(client, ASK) == whole.json()
    monkeypatch.undo()
    assert client.post("/v1/chat/completions", json=ASK).status_code == 200  # the server went on
