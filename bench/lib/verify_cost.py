"""What a verify row costs the engine, and the speedup that cost allows speculation at a given acceptance.

A verify row of width w (the last token and w - 1 drafts, logits at every position) runs as one engine step on one
slot. At one stream a decode step is bound by reading the weights once; each further token in the row adds its
multiply-adds over every weight, which run at the core's int8 (or fp32) compute rate. So the width's cost, not only
the acceptance, bounds what speculation can give at c=1: with per-draft acceptance a (each draft accepted with
probability a while the ones before it were), k drafts give E = (1 - a^(k+1)) / (1 - a) tokens a verify row, and the
decode-only speedup is at most max over k of E x cost(1) / cost(k + 1), before any per-step overhead or the prompt's
prefill, which both arms pay alike.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.step import Work

CONTEXT = 96  # cached positions under the row: about where the benchmark's rows decode (62-token prompts + 64)
STEPS = 60  # timed steps a width, after WARM
WARM = 5


def matrices(config: dict[str, Any]) -> list[tuple[int, int]]:
    """(K, N) of every weight matrix a Llama-shaped model multiplies one token by: each layer's fused q/k/v, o_proj,
    fused gate/up and down_proj, then the LM head (the embedding is a lookup; attention's own products grow with the
    context and are not here)."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    layer = [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * inner), (inner, hidden)]
    return layer * config["num_hidden_layers"] + [(hidden, config["vocab_size"])]


def macs_per_token(config: dict[str, Any]) -> int:
    """Multiply-adds of those matrices for one token."""
    return sum(k * n for k, n in matrices(config))


def measure(bundle: Path, widths: int, cpus: set[int], rounds: int = 3) -> dict[int, float]:
    """Median ms of one step of a row of each width 1..widths (logits at every position, as a verify row), on one
    slot holding CONTEXT positions, one intra-op thread on `cpus`; the widths interleaved over `rounds`."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        model = bundle / "model"
        engine = DecoderEngine(model, load_engine_config(model), threads=1, slots=1)
        engine.run(0, np.random.default_rng(0).integers(3, 1000, (1, CONTEXT)))
        times: dict[int, list[float]] = {w: [] for w in range(1, widths + 1)}
        for _ in range(rounds):
            for width in times:
                for step in range(WARM + STEPS):
                    started = time.perf_counter()
                    engine.step([Work(0, (5,) * width, width)])
                    if step >= WARM:
                        times[width].append(time.perf_counter() - started)
                    engine.truncate(0, CONTEXT)
        return {width: statistics.median(spent) * 1000 for width, spent in times.items()}
    finally:
        os.sched_setaffinity(0, before)


def tokens_per_row(acceptance: float, drafts: int) -> float:
    a = min(acceptance, 0.999)
    return (1 - a ** (drafts + 1)) / (1 - a)


def bound(acceptance: float, costs: dict[int, float]) -> tuple[float, int]:
    """(the most decode-only speedup, the drafts that give it) at this per-draft acceptance and these step costs."""
    return max((tokens_per_row(acceptance, w - 1) * costs[1] / costs[w], w - 1) for w in costs if w > 1)


def summary(bundle: Path, model: Path, widths: int, cpus: set[int]) -> dict[str, Any]:
    """The costs, each further token's share of a decode step and the rate its multiply-adds ran at."""
    costs = measure(bundle, widths, cpus)
    macs = macs_per_token(json.loads((model / "config.json").read_text()))
    extra = (costs[widths] - costs[1]) / (widths - 1)
    return {"context": CONTEXT, "ms": costs, "macs_per_token": macs, "extra_ms_per_token": extra,
            "extra_share": extra / costs[1], "extra_gmacs": macs / extra / 1e6 if extra > 0 else None}
