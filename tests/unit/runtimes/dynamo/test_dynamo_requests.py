"""A Dynamo worker's request mapping (runtimes/dynamo/requests.py), without Dynamo: every field honoured or refused
by name, hostile values bounded; and the prefix cache's journal, which the worker publishes as KV events."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtimes.bundle import load_engine_config
from runtimes.dynamo.card import write_card
from runtimes.dynamo.frontend import CPU_PREFILL_LOAD_SCALE, router_defaults
from runtimes.dynamo.requests import TOOL_PARSERS, chunk, guide_of, parsers, sampling_params
from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.prefix_cache import BLOCK, PrefixCache
from runtimes.generation.requests import Event
from runtimes.generation.sampling_request import InvalidSampling
from runtimes.settings import export_default
from tests.support.tiny_models import CHAT_TEMPLATE


def test_the_fields_a_client_sends_reach_the_scheduler() -> None:
    params = sampling_params({"sampling_options": {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3,
                                                   "presence_penalty": 0.5, "n": 1, "min_p": None},
                              "stop_conditions": {"max_tokens": 12, "min_tokens": 2, "ignore_eos": True,
                                                  "stop_token_ids_hidden": [7], "stop_token_ids": [9], "stop": ["x"]},
                              "output_options": {"logprobs": 3, "skip_special_tokens": False}}, context=64, prompt=10)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.7, 0.9, 5, 3)
    assert params.presence_penalty == 0.5
    assert (params.max_tokens, params.min_tokens, params.ignore_eos, params.stop_token_ids) == (12, 2, True, {7, 9})
    assert params.logprobs == 3 and params.skip_special_tokens is False and params.stop == ()  # Dynamo matches "x"
    assert sampling_params({}, context=64, prompt=10).max_tokens == 54  # the room left, as the HTTP API's default


@pytest.mark.parametrize(("request_", "named"), [
    ({"sampling_options": {"n": 2}}, "sampling_options.n"),
    ({"sampling_options": {"min_p": 0.1}}, "sampling_options.min_p"),
    ({"sampling_options": {"mirostat": 1}}, "sampling_options.mirostat"),
    ({"sampling_options": {"temperature": float("nan")}}, "sampling_options.temperature"),
    ({"sampling_options": {"temperature": True}}, "sampling_options.temperature"),
    ({"sampling_options": {"seed": 2**64}}, "sampling_options.seed"),  # past 64 bits, as the HTTP API refuses
    ({"stop_conditions": {"max_tokens": 60}}, "stop_conditions.max_tokens"),
    ({"stop_conditions": {"stop_token_ids": list(range(5000))}}, "stop_token_ids"),
    ({"stop_conditions": {"stop_token_ids_visible": [3]}}, "stop_conditions.stop_token_ids_visible"),
    ({"output_options": {"logprobs": 100}}, "output_options.logprobs"),
    ({"stop_conditions": {"max_tokens": 5, "min_tokens": 6}}, "min_tokens \\(6\\) exceeds"),
    ({"output_options": {"prompt_logprobs": 1}}, "output_options.prompt_logprobs"),
    ({"sampling_options": "hot"}, "sampling_options must be an object"),
    ({"sampling_options": {"guided_decoding": {"json": {}, "regex": "a"}}}, "guided_decoding"),
])
def test_what_mbuild_cannot_honour_is_refused_by_name(request_: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidSampling, match=named.replace(".", r"\.")):
        sampling_params(request_, context=64, prompt=10)
        guide_of(request_.get("sampling_options") or {})


def test_a_prompt_that_fills_the_context_is_refused() -> None:
    with pytest.raises(InvalidSampling, match="fill the context"):
        sampling_params({}, context=16, prompt=16)


def test_guided_decoding_becomes_the_http_apis_constraint() -> None:
    spec = guide_of({"guided_decoding": {"json": {"type": "object"}, "whitespace_pattern": None}})
    assert spec is not None and (spec.kind, spec.value) == ("json_schema", {"type": "object"})
    assert guide_of({"guided_decoding": {"choice": ["a", "b"]}}).kind == "choice"  # type: ignore[union-attr]
    assert guide_of({}) is None


def test_events_become_chunks_with_logprobs_ranked_and_usage_last() -> None:
    logprob = TokenLogprob(5, -0.1, ((6, -2.0), (5, -0.1)))
    first = chunk(Event(token=5, logprob=logprob), prompt=3, made=1, decode=lambda t: f"<{t}>")
    assert first["token_ids"] == [5] and first["log_probs"] == [-0.1]
    assert [(e["rank"], e["token_id"], e["token"]) for e in first["top_logprobs"][0]] == [(0, 5, "<5>"), (1, 6, "<6>")]
    last = chunk(Event(finish="length"), prompt=3, made=4, decode=str)
    assert last["finish_reason"] == "length" and last["completion_usage"] == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


class Slots:
    bytes_per_token = 4

    def read(self, row: int, count: int) -> list[np.ndarray]:
        return [np.zeros(count)]


def test_the_journal_records_new_blocks_with_their_parent_and_what_eviction_removes() -> None:
    cache = PrefixCache(capacity_bytes=6 * BLOCK * Slots.bytes_per_token)  # room for two copies of three blocks
    cache.journal = collections.deque()
    shared = list(range(2 * BLOCK))
    first_prompt = [*shared, *range(100, 100 + BLOCK), 1]
    cache.adopt(first_prompt, Slots().read(0, 3 * BLOCK), 3 * BLOCK * Slots.bytes_per_token)
    cache.pin(2, [*shared, *range(200, 200 + BLOCK), 1])  # shares two blocks: only its third is new
    first, second = cache.journal.popleft(), cache.journal.popleft()
    assert first[0] == "stored" and len(first[2]) == 3 and first[3] is None and len(first[1]) == 3 * BLOCK
    assert second[0] == "stored" and len(second[2]) == 1 and second[3] == first[2][1]  # parent: the shared block
    assert second[1] == tuple(range(200, 200 + BLOCK))
    cache.adopt([*range(300, 300 + 3 * BLOCK), 1], Slots().read(0, 3 * BLOCK), 3 * BLOCK * Slots.bytes_per_token)
    assert cache.journal.popleft()[0] == "stored"
    cache.adopt([*range(400, 400 + 3 * BLOCK), 1], Slots().read(0, 3 * BLOCK), 3 * BLOCK * Slots.bytes_per_token)
    removed = cache.journal.popleft()  # needs room: the oldest copy goes; the resident entry holds the shared blocks
    assert removed == ("removed", (), (first[2][2],), None)
    assert cache.journal.popleft()[0] == "stored" and not cache.journal
    cache.pin(2, [*shared, 7])  # the slot's sequence is now two blocks long: its third block goes, then the rest
    assert cache.journal.popleft() == ("removed", (), (second[2][0],), None) and not cache.journal
    cache.unpin(2)
    assert cache.journal.popleft() == ("removed", (), tuple(first[2][:2]), None) and not cache.journal


def test_every_replica_registers_the_same_card(tiny_llm_build: Path, tmp_path: Path) -> None:
    """Dynamo's frontend keeps the first card a model registers and rejects a worker whose card differs, path
    included: replicas of one bundle must land on one folder, written once."""
    model = tiny_llm_build / "model"
    config = load_engine_config(model)
    first, second = write_card(model, config, tmp_path), write_card(model, config, tmp_path)
    assert first == second and sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    tokenizer = json.loads((first / "tokenizer_config.json").read_text())
    assert tokenizer["chat_template"] == config.decoder.chat_template
    assert json.loads((first / "config.json").read_text())["max_position_embeddings"] == config.max_seq_length


@pytest.mark.parametrize(("template", "setting", "expected"), [
    (CHAT_TEMPLATE, "auto", ("llama3_json", None)),
    ("{{ '<tool_call>' }}{{ '<think>' }}{{ '</think>' }}", "auto", ("hermes", "basic")),
    ("[TOOL_CALLS] {{ tools }}", "auto", ("mistral", None)),
    ("{{ '<|start|>assistant<|channel|>final<|message|>' }}", "auto", ("harmony", "gpt_oss")),
    (CHAT_TEMPLATE, "none", (None, None)),  # tool calls turned off: the frontend parses none either
    ("{{ messages }}", "hermes", ("hermes", None)),  # named by MBUILD_TOOL_CALL_PARSER
    ("{{ messages }}", "granite", (None, None)),  # a format Dynamo has no parser for
])
def test_the_frontend_parses_replies_as_mbuilds_server_would(template: str, setting: str,
                                                             expected: tuple[str | None, str | None]) -> None:
    assert parsers(template, setting) == expected


def test_every_parser_name_is_one_dynamo_has() -> None:
    core = pytest.importorskip("dynamo._core", reason="the dynamo extra is not installed (tests/run.sh installs it)")
    assert set(TOOL_PARSERS.values()) | {"harmony"} <= set(core.get_tool_parser_names())
    assert {"basic", "gpt_oss"} <= set(core.get_reasoning_parser_names())


def test_a_cpu_engine_s_frontend_weighs_prefill_above_its_load_unless_the_operator_says(
        tiny_llm_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_engine_config(tiny_llm_build / "model")
    assert router_defaults(config) == {"DYN_ROUTER_PREFILL_LOAD_SCALE": str(CPU_PREFILL_LOAD_SCALE)}
    assert router_defaults(dataclasses.replace(config, engine="tensorrt")) == {}  # a GPU engine: Dynamo's 1:1
    monkeypatch.setenv("DYN_ROUTER_PREFILL_LOAD_SCALE", "3")
    export_default("DYN_ROUTER_PREFILL_LOAD_SCALE", "16")
    assert os.environ["DYN_ROUTER_PREFILL_LOAD_SCALE"] == "3"  # the operator's value stays
