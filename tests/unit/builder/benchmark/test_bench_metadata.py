"""/v1/metadata through one model (runtimes/api/schemas.py Metadata): the route serves it and `mbuild bench` reads it
back, so what bench learns of a served mbuild (name, task, profile, context, chat template) is what the route says."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from builder.benchmark import target
from runtimes.api.schemas import Metadata
from tests.unit.runtimes.api.test_generation_service import client

__all__ = ["client"]  # the tiny Llama served in-process (a fixture)


def test_the_route_serves_the_model_and_bench_reads_it_back(client: TestClient,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    body = client.get("/v1/metadata").json()
    config = client.app.state.service.config  # type: ignore[attr-defined]
    meta = Metadata.model_validate(body)
    assert meta.engine == config and meta.model_dump(mode="json") == body  # read back as served, field for field
    monkeypatch.setattr(target, "_get", lambda url, key, timeout=5: client.get(url))
    served = target.describe("url", "http://testserver", "http://testserver", None, "builtin", None, False)
    assert (served.model, served.task, served.profile_id, served.profile, served.context) == (
        body["name"], "text-generation", body["profile"]["id"], body["profile"]["name"], config.max_seq_length)
    assert served.chat is bool(config.decoder.chat_template)


NIM = {"modelInfo": [{"modelUrl": "ngc://nim/meta/llama", "shortName": "llama"}], "version": "1.0.0"}
LATER_ENGINE = {"name": "m", "engine": {"format": 99, "task": "text-generation"}, "validation": {},
                "versions": {}, "status": "ready"}


@pytest.mark.parametrize("status,body", [(200, NIM), (200, LATER_ENGINE), (404, {"error": "no such route"})])
def test_metadata_that_is_not_mbuilds_falls_back_to_the_model_list(status: int, body: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Another server's route of that name (NIM's), an engine.json this mbuild cannot read, or no route: the server
    is described by its /v1/models, as any OpenAI server is."""
    answers = {"/v1/metadata": httpx.Response(status, json=body), "/v1/models": httpx.Response(
        200, json={"object": "list", "data": [{"id": "peer-model"}]})}
    monkeypatch.setattr(target, "_get", lambda url, key, timeout=5: answers[url.removeprefix("http://peer")])
    served = target.describe("url", "http://peer", "http://peer", None, "builtin", None, False)
    assert (served.model, served.task, served.profile, served.context) == ("peer-model", "text-generation", "", None)
