"""An encoder's attention scores grow with the square of a sequence: the engine splits a batch past the budget
(runtimes/bundle/engine.py), and the plan counts a served-context sequence's scores beyond it. Measured once on a
16-head Qwen3 body served 8 pairs of 4096 tokens: 2.76 GB peak with the split, where one call holds ~19 GB."""

from __future__ import annotations

import pytest

from builder.model.catalog import lookup_alias
from builder.planning.memory import CPU_OVERHEAD_GB, memory_need
from builder.planning.profiles import load_profiles
from runtimes.bundle.engine import ATTENTION_BUDGET_BYTES, attention_bytes
from runtimes.engines.encoder import attention_calls


def padded_cost(call: list[int], lengths: list[int], heads: int) -> float:
    return len(call) * attention_bytes(heads, max(lengths[i] for i in call))


@pytest.mark.parametrize(("lengths", "heads"), [
    ([128] * 32, 12),  # MiniLM's batch: one call
    ([4096, 30, 4096, 700, 2048, 5, 4096, 1500], 16),  # a decoder body's long pairs
    ([8192], 32),  # one sequence over the budget alone
    ([300, 1200, 50, 900] * 8, 16),
])
def test_calls_cover_every_sequence_once_within_the_budget(lengths: list[int], heads: int) -> None:
    calls = attention_calls(lengths, heads)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    for call in calls:
        assert len(call) == 1 or padded_cost(call, lengths, heads) <= ATTENTION_BUDGET_BYTES, call
        assert [lengths[i] for i in call] == sorted(lengths[i] for i in call)  # by length: little padding
    if sum(attention_bytes(heads, n) for n in lengths) * len(lengths) <= ATTENTION_BUDGET_BYTES:
        assert len(calls) == 1


def test_an_engine_json_without_heads_runs_one_call() -> None:
    assert attention_calls([8192] * 8, 0) == [list(range(8))]


def test_the_plan_counts_a_long_sequences_scores_past_the_budget() -> None:
    profiles = [p for p in load_profiles() if p.device == "cpu" and p.precision == "fp32" and p.mode == "latency"]
    reranker, minilm = lookup_alias("qwen3-reranker-0.6b"), lookup_alias("all-minilm-l6-v2")
    assert reranker is not None and minilm is not None
    facts = reranker.facts()
    context = min(profiles[0].limits.context or facts.context, facts.context)
    scores = facts.heads * context**2 * 4 * 3  # three fp32 copies of [heads, context, context]
    need = memory_need(facts, profiles[0])
    assert need.overhead_gb == pytest.approx(CPU_OVERHEAD_GB + (scores - ATTENTION_BUDGET_BYTES) / 1e9)
    assert memory_need(minilm.facts(), profiles[0]).overhead_gb == CPU_OVERHEAD_GB  # short: inside the headroom
