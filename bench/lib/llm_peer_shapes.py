"""The model shapes of the llama.cpp comparison (bench/scenarios/llm_peer.py) and how much each runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY


@dataclass(frozen=True)
class Shape:
    key: str
    title: str
    config: dict[str, Any]
    concurrency: tuple[int, ...] = (1, 4, 16)
    sequential: int = 4  # requests at concurrency 1
    warm: int = 16  # the concurrency of the warm-up wave each arm gets before the rounds
    new_tokens: int = 64
    max_repeats: int = 99
    greedy_prompts: int = 8
    greedy_tokens: int = 16
    prefix_tokens: int = 1000
    prefix_samples: int = 3
    run_seconds: float = 300.0
    # the pair's servers up one at a time, each arm's rounds in turn: where both together would not fit in the host's
    # RAM, a pair measures paging, not engines (seen: a dense 1.7B's fp32 KV for 16 x 2048 beside llama.cpp's weights)
    apart: bool = False


SHAPES = (Shape("100m", "random ~100M Llama", LLAMA_100M),
          # fp32 reads ~4 GB of weights a decode step on one core (~0.25 s): one request at c=1, a c=4 warm-up,
          # one round, one shared-prefix sample
          Shape("1b", "random Llama-3.2-1B-shaped", LLAMA_1B, sequential=1, warm=4, max_repeats=1,
                prefix_samples=1, run_seconds=1200.0))


def quick(shape: Shape) -> Shape:
    """A smoke-sized version: two concurrencies, short outputs, few prompts."""
    return replace(shape, concurrency=(1, 4), sequential=2, warm=4, new_tokens=16, greedy_prompts=2, greedy_tokens=8,
                   prefix_tokens=256, prefix_samples=1, max_repeats=1)


QUICK = quick(Shape("tiny", "random tiny Llama (quick)", LLAMA_TINY))
