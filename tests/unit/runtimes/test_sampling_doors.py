"""Both front doors of generation, the OpenAI routes (served in-process on the tiny Llama) and Dynamo's worker
mapping (runtimes/dynamo/requests.py), refuse the same out-of-bounds field and take the same in-bounds one: they
share one check (runtimes/generation/sampling_request.py), and this fails when a door stops using it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from runtimes.dynamo.requests import guide_of, sampling_params
from runtimes.generation.sampling_request import MAX_GRAMMAR, InvalidSampling
from tests.unit.runtimes.api.test_generation_service import client

__all__ = ["client"]  # the module-scoped service fixture, shared
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CONTEXT = 1024  # the tiny Llama's, so both doors fit max_tokens against the same room


def sampled(**fields: Any) -> dict[str, Any]:
    return {"sampling_options": fields}


def stopped(**fields: Any) -> dict[str, Any]:
    return {"stop_conditions": {"max_tokens": 4, **fields}}


# (OpenAI body fields, the word its 400 names, Dynamo's request, the word its refusal names)
CASES = {
    "temperature 3": ({"temperature": 3}, "temperature", sampled(temperature=3), "sampling_options.temperature"),
    "top_p 0": ({"top_p": 0}, "top_p", sampled(top_p=0), "sampling_options.top_p"),
    "seed past 64 bits": ({"seed": 2**64}, "seed", sampled(seed=2**64), "sampling_options.seed"),
    "top_k past the bound": ({"top_k": 2**21}, "top_k", sampled(top_k=2**21), "sampling_options.top_k"),
    "repetition_penalty 0": ({"repetition_penalty": 0}, "repetition_penalty", sampled(repetition_penalty=0),
                             "sampling_options.repetition_penalty"),
    "max_tokens past the context": ({"max_tokens": 2000}, "context length", stopped(max_tokens=2000),
                                    "context length"),
    "min_tokens above max_tokens": ({"min_tokens": 5}, "min_tokens", stopped(min_tokens=5),
                                    "stop_conditions.min_tokens"),
    "a negative stop id": ({"stop_token_ids": [-1]}, "stop_token_ids", stopped(stop_token_ids=[-1]),
                           "stop_conditions.stop_token_ids"),
    "9 stop strings": ({"stop": list("abcdefghi")}, "stop", stopped(stop=list("abcdefghi")), "stop_conditions.stop"),
    "a 300-character stop string": ({"stop": ["x" * 300]}, "stop", stopped(stop=["x" * 300]),
                                    "stop_conditions.stop"),
    "ignore_eos as text": ({"ignore_eos": "yes"}, "ignore_eos", stopped(ignore_eos="yes"),
                           "stop_conditions.ignore_eos"),
    "21 logprobs": ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", {"output_options": {"logprobs": 21}},
                    "output_options.logprobs"),
    "a regex past the limit": ({"guided_regex": "a" * (MAX_GRAMMAR + 1)}, "guided_regex",
                               sampled(guided_decoding={"regex": "a" * (MAX_GRAMMAR + 1)}), "guided_decoding.regex"),
    "an empty choice": ({"guided_choice": [""]}, "guided_choice", sampled(guided_decoding={"choice": [""]}),
                        "guided_decoding.choice"),
    "a schema that is not JSON": ({"guided_json": "{"}, "guided_json", sampled(guided_decoding={"json": "{"}),
                                  "guided_decoding.json"),
}


def dynamo(request: dict[str, Any]) -> None:
    sampling_params(request, context=CONTEXT, prompt=10)
    guide_of(request.get("sampling_options") or {})


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_both_doors_refuse_the_same_field(client: TestClient, case: tuple[dict[str, Any], str, dict[str, Any], str]
                                          ) -> None:
    openai, openai_word, request, dynamo_word = case
    got = client.post("/v1/chat/completions", json={**CHAT, **openai})
    assert got.status_code == 400 and openai_word in got.json()["error"]["message"], got.text
    with pytest.raises(InvalidSampling, match=dynamo_word):
        dynamo(request)


def test_both_doors_take_any_64_bit_seed(client: TestClient) -> None:
    for seed in (-1, 2**64 - 1):
        assert client.post("/v1/chat/completions", json={**CHAT, "seed": seed}).status_code == 200
        assert sampling_params(sampled(seed=seed), context=CONTEXT, prompt=10).seed == seed
