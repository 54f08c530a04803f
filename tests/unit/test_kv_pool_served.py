"""The KV pool on the real engine: the tiny trained Llama (tests/support/tiny_models.py) served with a pool smaller
than its slots x context. Eight greedy sequences that together outgrow it (ignore_eos, so each runs its length)
must come back token for token as with the whole pool: some waited for room or were preempted and filled again
from their tokens on the graph. The metrics speak in the pool's terms, parsed as Prometheus reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from runtimes.bundle import load_engine_config
from runtimes.bundle.engine import KV_BLOCK_TOKENS
from tests.unit.test_generation_service import serving

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
           "def add(a, b):\n    return a + b", "Containers package software"]
SLOTS, NEW = 8, 300


def _answers(client: Any) -> list[list[str]]:
    body = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": NEW, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return [c["logprobs"]["tokens"] for c in sorted(response.json()["choices"], key=lambda c: c["index"])]


def test_sequences_that_outgrow_a_small_pool_come_back_as_with_the_whole_one(tiny_llm_build: Path) -> None:
    model = tiny_llm_build / "model"
    options = load_engine_config(model).decoder
    per_token = 2 * options.layers * options.kv_heads * options.head_dim * 4
    pool_tokens = (1 << 20) // per_token // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS  # MBUILD_KV_CACHE_MB=1
    assert pool_tokens < SLOTS * (NEW + 16), "the pool must be too small for the eight at once"
    with serving(model, served_name="tiny", max_batch=SLOTS) as client:
        whole = _answers(client)
    with serving(model, served_name="tiny", max_batch=SLOTS, kv_cache_mb=1) as client:
        pooled = _answers(client)
        found = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
                 for s in f.samples}
    assert pooled == whole and all(len(tokens) == NEW for tokens in pooled)
    assert found["mbuild_kv_cache_capacity_tokens"] == pool_tokens
    assert found["mbuild_kv_cache_blocks"] == pool_tokens // KV_BLOCK_TOKENS
    assert found["vllm:num_preemptions_total"] >= 1
    assert found["vllm:kv_cache_usage_perc"] <= 1.0
