"""The speculative decoding benchmark's model and prompts (bench/lib/spec_model.py, spec_prompts.py): f is a
permutation with one cycle through the text-streaming tokens, a model built from it decodes f greedily, and each
prompt kind gives the lookup acceptance its design says."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.lib.harness import median_interval
from bench.lib.spec_arms import Plan
from bench.lib.spec_model import agreeing_weights, cycles, with_errors
from bench.lib.spec_prompts import (
    NEW_TOKENS,
    PROMPT_TOKENS,
    Kind,
    chained,
    kinds,
    lookup,
    prompts,
    replay,
    widths,
)
from bench.lib.spec_report import speedups, targets


def test_f_is_a_permutation_with_one_cycle_through_the_text_tokens() -> None:
    silent = {0, 1, 2, 7, 99}
    successor, order = cycles(200, silent)
    assert sorted(successor) == list(range(200))
    assert set(order.tolist()) == set(range(200)) - silent
    assert all(successor[order[i]] == order[(i + 1) % order.size] for i in range(order.size))
    token, seen = int(order[0]), set()
    while token not in seen:
        seen.add(token)
        token = int(successor[token])
    assert len(seen) == order.size  # one cycle, not several


@pytest.mark.parametrize("error", [0.0, 0.3])
def test_a_model_of_the_construction_decodes_f_greedily(error: float) -> None:
    """The target's f, and a draft's (f with errors, no longer a permutation)."""
    vocab = 512
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=256)
    successor, order = cycles(vocab, {0, 1, 2})
    successor = with_errors(successor, order, error, 1) if error else successor
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict({k: v.float() for k, v in agreeing_weights(config, successor, 0).items()})
    start = [int(t) for t in order[:5]]
    chain = start[-1:]
    for _ in range(24):
        chain.append(int(successor[chain[-1]]))
    with torch.no_grad():
        out = model.generate(torch.tensor([start]), max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert out[0, 5:].tolist() == chain[1:]
    assert error == 0 or chain[1:] != [int(t) for t in order[5:29]]  # the draft's errors are on this path


# Lookup's k follows its last right run (mbuild's rule), so an edit every J-th token is drafted up to it: J - 3 of
# J - 2 drafts right once k has settled (edit5: 2 of 3, below it while k comes down from 8); repeat runs past the
# prompt's end once.
@pytest.mark.parametrize(("key", "acceptance"), [("repeat", (0.9, 0.95)), ("edit2", None), ("edit3", (0.0, 0.0)),
                                                 ("edit5", (0.5, 2 / 3)), ("edit10", (7 / 8, 7 / 8)), ("open", None)])
def test_each_prompt_kind_gives_the_lookup_acceptance_it_is_built_for(
        key: str, acceptance: tuple[float, float] | None) -> None:
    order = np.random.default_rng(3).permutation(np.arange(3, 32000))
    kind = next(k for k in kinds((2, 3, 5, 10)) if k.key == key)
    for ids, expected in prompts(kind, order, 4, 11):
        assert len(ids) == PROMPT_TOKENS and len(expected) == NEW_TOKENS
        assert expected == [int(order[(int(np.flatnonzero(order == ids[-1])[0]) + 1 + i) % order.size])
                            for i in range(NEW_TOKENS)]
        counts = lookup(ids, expected)
        got = counts["accepted"] / counts["drafted"] if counts["drafted"] else None
        assert got == acceptance if acceptance is None or got is None else acceptance[0] <= got <= acceptance[1]
        steps = widths(ids, expected)  # the same replay, step by step: each emits its accepted + 1
        assert sum(steps) - len(steps) == counts["drafted"]
        assert len(steps) == NEW_TOKENS - counts["accepted"]


@pytest.mark.parametrize("error", [0.1, 0.25])
def test_a_draft_wrong_after_a_share_of_tokens_is_accepted_about_the_rest(error: float) -> None:
    successor, order = cycles(32000, {0, 1, 2})
    drafted = with_errors(successor, order, error, 5)
    assert abs(float(np.mean(drafted[order] != successor[order])) - error) < 0.01
    counts = [replay(ids, expected, chained(drafted), 4) for ids, expected in prompts(Kind("open"), order, 64, 3)]
    accepted, made = sum(c["accepted"] for c in counts), sum(c["drafted"] for c in counts)
    # a draft row is taken up to its first wrong draft: accepted / drafted runs below 1 - error, as a server's does
    assert 0.5 * (1 - error) < accepted / made < 1 - error + 0.02


@pytest.mark.parametrize("count", [6, 9, 20, 40])
def test_the_median_interval_covers_the_median_as_often_as_it_says(count: int) -> None:
    """The report judges c=16 by the median's 95% interval over the paired waves (bench/lib/harness.py)."""
    rng = np.random.default_rng(count)
    trials = 4000
    samples = rng.standard_normal((trials, count)) + rng.choice([-1.0, 1.0], (trials, count))  # median 0, bimodal
    covered = 0
    for sample in samples:
        found = median_interval(sample.tolist())
        assert found is not None and found[0] <= found[1]
        covered += found[0] <= 0.0 <= found[1]
    # its coverage is the binomial's: at least 95%, and not far above (the next-narrower interval falls below)
    assert 0.95 <= covered / trials <= 0.99


def test_too_few_values_give_no_median_interval() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)


def _runs(tok_s: list[float], drafted: int = 0, accepted: int = 0) -> list[dict[str, float]]:
    return [{"total_tok_s": t, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.0, "ttft_p50_ms": 1.0, "draft_n": drafted,
             "draft_n_accepted": accepted, "tokens": 64.0} for t in tok_s]


@pytest.mark.parametrize(("c1_on", "c16_on", "c1_word", "c16_word"), [
    ([2.0 + 0.01 * i for i in range(20)], [1.0] * 20, "met", "met"),
    ([1.5] * 20, [0.5] * 20, "**missed**", "**missed**"),
    ([1.5 + 0.05 * i for i in range(20)], [0.85 + 0.01 * i for i in range(20)], "not told apart", "not told apart"),
])
def test_the_targets_judge_c1_and_c16_by_the_pairs_median_interval(
        c1_on: list[float], c16_on: list[float], c1_word: str, c16_word: str) -> None:
    """mbuild's arms alternate waves at every concurrency (Plan.waves), so both lines are judged by the interval of
    the median over the adjacent pairs: met where all of it clears the line, missed where none does."""
    plan = Plan(kinds(()), concurrency=(1, 16), repeats=5)
    assert plan.waves("mbuild") == plan.pairs > 1 == plan.waves("llama.cpp")  # at every concurrency
    off = [1.0] * 20
    runs = {"repeat mbuild off c=1": _runs(off), "repeat mbuild ngram c=1": _runs(c1_on, 100, 90),
            "repeat mbuild off c=16": _runs(off), "repeat mbuild ngram c=16": _runs(c16_on, 100, 90)}
    _, lines = targets(speedups({"runs": runs}, plan), plan)
    c1 = next(line for line in lines if line.startswith("  - repeat"))
    c16 = next(line for line in lines if line.startswith("- c=16"))
    assert "over 20 pairs" in c1 and c1_word in c1.split("against off")[0]
    assert "over 20 pairs" in c16 and c16_word in c16
