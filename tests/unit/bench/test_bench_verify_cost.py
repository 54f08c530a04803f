"""The speculative benchmark's verify-cost bound (bench/lib/verify_cost.py): the multiply-adds it counts are the
weight matrices transformers builds for the shape, and the bound is the expected tokens a row over its cost."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from bench.lib.llm_models import LLAMA_TINY
from bench.lib.verify_cost import bound, macs_per_token, tokens_per_row


def test_the_multiply_adds_are_the_models_weight_matrices() -> None:
    shape: dict[str, Any] = {**LLAMA_TINY, "vocab_size": 1000}
    model = LlamaForCausalLM(LlamaConfig(**shape))
    matrices = sum(p.numel() for name, p in model.named_parameters()
                   if p.ndim == 2 and "embed_tokens" not in name)  # the embedding is a lookup, not a product
    assert macs_per_token(shape) == matrices


def test_free_verify_rows_give_every_expected_token() -> None:
    flat = {w: 1.0 for w in range(1, 6)}
    assert bound(0.75, flat) == pytest.approx((tokens_per_row(0.75, 4), 4))
    assert tokens_per_row(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_costly_rows_cap_the_speedup_and_pick_fewer_drafts() -> None:
    costs = {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}  # each further token 20% of a step
    most, drafts = bound(0.75, costs)
    assert most == pytest.approx(max(tokens_per_row(0.75, k) / costs[k + 1] for k in range(1, 5)))
    assert most < 1.8 and drafts < 4
    assert bound(0.0, costs)[0] < 1  # nothing accepted: every verify row is a loss
