"""The hostile-input corpus (tests/support/hostile_cases.py, hostile_rerank_cases.py) against the app in-process, on
the tiny encoder, the tiny Llama and the tiny cross-encoder: the same cases and the same judge as the integration
run (which adds innocent clients, memory and a real server), so a case a change breaks fails here first. Each
answer is the status the case wants, with a JSON error that names the field at fault, and the service stays
ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.corpus import KEY, Case, check, send, served_model
from tests.support.hostile_cases import ENCODER_CASES, LLM_CASES
from tests.support.hostile_rerank_cases import RERANK_CASES
from tests.unit.runtimes.api.test_generation_service import serving


def served_as_in_ci(build: Path) -> Iterator[TestClient]:
    # As the integration run serves it: a key, and a body limit that lets oversized lists reach the parser.
    with serving(build / "model", api_key=KEY, max_body_bytes=8 << 20) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def client(tiny_llm_build: Path) -> Iterator[TestClient]:
    yield from served_as_in_ci(tiny_llm_build)


@pytest.fixture(scope="module")
def encoder(tiny_build: Path) -> Iterator[TestClient]:
    yield from served_as_in_ci(tiny_build)


@pytest.fixture(scope="module")
def reranker(tiny_rerank_build: Path) -> Iterator[TestClient]:
    yield from served_as_in_ci(tiny_rerank_build)


def answers_as_a_user_must_see(client: TestClient, case: Case) -> None:
    got = send(client, "", case, served_model(client, ""), timeout=None)
    assert check(case, got) is None, check(case, got)
    assert client.get("/v1/health/ready").status_code == 200


@pytest.mark.parametrize("case", LLM_CASES, ids=lambda case: case.name)
def test_each_case_gets_the_answer_a_user_must_see(client: TestClient, case: Case) -> None:
    answers_as_a_user_must_see(client, case)


@pytest.mark.parametrize("case", ENCODER_CASES, ids=lambda case: case.name)
def test_each_embedding_case_gets_the_answer_a_user_must_see(encoder: TestClient, case: Case) -> None:
    answers_as_a_user_must_see(encoder, case)


@pytest.mark.parametrize("case", RERANK_CASES, ids=lambda case: case.name)
def test_each_rerank_case_gets_the_answer_a_user_must_see(reranker: TestClient, case: Case) -> None:
    answers_as_a_user_must_see(reranker, case)
