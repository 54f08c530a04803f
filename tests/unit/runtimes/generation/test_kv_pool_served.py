"""The KV pool on the real engine: the tiny trained Llama (tests/support/tiny_models.py) served with a pool smaller
than its slots x context. Eight greedy sequences that together outgrow it (ignore_eos, so each runs its length)
must come back token for token as with the whole pool: some waited for room or were preempted and filled again
from their tokens on the graph. The metrics speak in the pool's terms, parsed as Prometheus reads them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from runtimes.bundle import load_engine_config
from runtimes.bundle.codec import write_contract
from runtimes.bundle.engine import ENGINE_FILE, KV_BLOCK_TOKENS
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.step import Work, pack
from tests.unit.runtimes.api.test_generation_service import serving

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
           "def add(a, b):\n    return a + b", "Containers package software"]
SLOTS, NEW = 8, 300


def _answers(client: Any) -> list[list[str]]:
    body = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": NEW, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return [c["logprobs"]["tokens"] for c in sorted(response.json()["choices"], key=lambda c: c["index"])]


def _metrics(client: Any) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}


def test_sequences_that_outgrow_a_small_pool_come_back_as_with_the_whole_one(tiny_llm_build: Path,
                                                                             tmp_path: Path) -> None:
    """The small pool is the plan's (engine.json's batching.kv_cache_bytes, as an fp32 cache that failed its int8
    gate gets); MBUILD_KV_CACHE_MB set over it wins."""
    model = tmp_path / "model"
    shutil.copytree(tiny_llm_build / "model", model)
    config = load_engine_config(model)
    per_token = DecoderEngine(model, config, threads=1, slots=1).bytes_per_token  # at its cache's type
    pool_tokens = 2048
    assert pool_tokens < SLOTS * (NEW + 16), "the pool must be too small for the eight at once"
    with serving(model, served_name="tiny", max_batch=SLOTS) as client:
        whole = _answers(client)
        assert _metrics(client)["mbuild_kv_cache_capacity_tokens"] >= SLOTS * (NEW + 16)
    small = dataclasses.replace(config.batching, kv_cache_bytes=pool_tokens * per_token)
    write_contract(model / ENGINE_FILE, config.with_batching(small))
    with serving(model, served_name="tiny", max_batch=SLOTS) as client:
        pooled = _answers(client)
        found = _metrics(client)
    assert pooled == whole and all(len(tokens) == NEW for tokens in pooled)
    assert found["mbuild_kv_cache_capacity_tokens"] == pool_tokens
    assert found["mbuild_kv_cache_blocks"] == pool_tokens // KV_BLOCK_TOKENS
    assert found["vllm:num_preemptions_total"] >= 1
    assert found["vllm:kv_cache_usage_perc"] <= 1.0
    with serving(model, served_name="tiny", max_batch=SLOTS, kv_cache_mb=1) as client:
        assert _metrics(client)["mbuild_kv_cache_capacity_tokens"] > pool_tokens  # the operator's size


def test_a_prefix_left_in_a_slot_or_copied_from_another_gives_the_logits_it_gave_in_its_own_slot(
        tiny_llm_build: Path) -> None:
    """The real engine's two ways of reusing a prefix without a copy entry (prefix_cache.py): in place, in the slot a
    sequence left it in after release, and copied from another slot. Either way the rest of the prompt gives the
    logits it gives on the slot that computed the prefix and kept it (a quantized build's activations are scaled per
    call, so a prefill cut elsewhere rounds otherwise: the reference is cut where the reuse is), after a run over the
    slots on both sides has padded the free one."""
    model = tiny_llm_build / "model"
    engine = DecoderEngine(model, load_engine_config(model), threads=1, slots=4)
    prompt = np.arange(3, 3 + 2 * KV_BLOCK_TOKENS + 5)[None, :]
    held = 2 * KV_BLOCK_TOKENS
    engine.run(3, prompt[:, :held + 3])
    engine.truncate(3, held)
    want = engine.run(3, prompt[:, held:])
    engine.run(1, prompt[:, :held + 3])
    engine.release(1)  # the sequence left: its positions stay in the slot
    for slot in (0, 2):
        engine.run(slot, prompt[:, :4])
    runs = pack([Work(0, (7,)), Work(2, (8,))], engine.lengths.tolist(), engine.context, engine.kept.tolist())
    assert [(run.first, len(run.rows)) for run in runs] == [(0, 3)]  # one run over slots 0..2, the free one padded
    engine.step([Work(0, (7,)), Work(2, (8,))])
    engine.keep(1, held)
    engine.copy(1, 0, held)
    for slot in (1, 0):
        np.testing.assert_allclose(engine.run(slot, prompt[:, held:]), want, atol=1e-5)
