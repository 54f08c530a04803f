"""Choosing the next token from logits, per request, as OpenAI and vLLM clients expect."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from runtimes.generation.guided import Grammar, Guide

MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300  # OpenAI's own limit on logit_bias entries


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    seed: int | None = None
    repetition_penalty: float = 1.0  # HF style, over prompt and output
    presence_penalty: float = 0.0  # OpenAI style, over output
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()  # a set: looked up once per token
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, -100..100) added to the logits, as OpenAI does
    logprobs: int | None = None  # each generated token's log-probability and this many alternatives
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (echo)
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows are sampled
    skip_special_tokens: bool = True  # as vLLM: False keeps markers such as [TOOL_CALLS] in the text
    keep_special_tokens: frozenset[int] = frozenset()  # skipped but these: the markers a chat's readers read
    speculative: bool = True  # False: this request never speculates, whatever the server's setting


@dataclass
class SamplerState:
    """What sampling needs to remember for one sequence."""

    params: SamplingParams
    prompt: list[int]
    rng: np.random.Generator
    generated: list[int] = field(default_factory=list)
    counts: Counter[int] = field(default_factory=Counter)
    guide: Guide | None = None

    @classmethod
    def start(cls, params: SamplingParams, prompt: list[int]) -> SamplerState:
        # Any integer seeds: negative and 64-bit ones map onto the generator's non-negative seeds.
        seed = None if params.seed is None else params.seed % (1 << 64)
        guide = params.grammar.guide() if params.grammar is not None else None
        return cls(params, prompt, np.random.default_rng(seed), guide=guide)

    @property
    def complete(self) -> bool:
        """The grammar, if any, can take nothing more: the sequence is done."""
        return self.guide is not None and self.guide.finished

    def record(self, token: int) -> int:
        self.generated.append(token)
        self.counts[token] += 1
        if self.guide is not None:
            self.guide.consume(token)
        return token


def _penalize(logits: np.ndarray, state: SamplerState) -> np.ndarray:
    p = state.params
    if p.repetition_penalty != 1.0:
        seen = np.fromiter(set(state.prompt) | set(state.counts), dtype=np.int64)
        if seen.size:
            values = logits[seen]
            logits[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and state.counts:
        tokens = np.fromiter(state.counts.keys(), dtype=np.int64)
        counts = np.fromiter(state.counts.values(), dtype=np.float32)
        logits[tokens] -= p.presence_penalty + p.frequency_penalty * counts
    return logits


def next_token(logits: np.ndarray, state: SamplerState, eos_ids: tuple[int, ...]) -> int:
    """One row's next token; records it in the state."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # extremes are handled below
        return _next_token(logits, state, eos_ids)


def _next_token(logits: np.ndarray, state: SamplerState, eos_ids: tuple[int, ...]) -> int:
    p = state.params
    logits = _penalize(np.array(logits, dtype=np.float32), state)
    if p.logit_bias:
        ids, bias = zip(*p.logit_bias, strict=True)
        logits[list(ids)] += np.asarray(bias, dtype=np.float32)
    allowed = state.guide.allowed() if state.guide is not None else None
    if allowed is not None:
        logits[~allowed[: logits.shape[0]]] = -np.inf
    if len(state.generated) < p.min_tokens:
        banned = [t for t in (*eos_ids, *p.stop_token_ids) if 0 <= t < logits.shape[0]]
        kept = logits.copy() if allowed is not None else None
        logits[banned] = -np.inf
        if kept is not None and not np.isfinite(logits).any():
            logits = kept  # the grammar allows only an end here: it outranks min_tokens
    if p.temperature <= 0:
        token = int(np.argmax(logits))
    else:
        scaled = logits / p.temperature
        if 0 < p.top_k < scaled.shape[0]:
            cutoff = np.partition(scaled, -p.top_k)[-p.top_k]
            scaled[scaled < cutoff] = -np.inf
        probs = np.exp(scaled - np.max(scaled))
        total = probs.sum()
        if not np.isfinite(total) or total <= 0:  # extreme settings overflowed: fall back to the best token
            return state.record(int(np.nanargmax(np.where(np.isfinite(logits), logits, -np.inf))))
        probs /= total
        if p.top_p < 1.0:
            order = np.argsort(-probs)
            cumulative = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cumulative, p.top_p) + 1)]
            trimmed = np.zeros_like(probs)
            trimmed[keep] = probs[keep]
            probs = trimmed / trimmed.sum()
        token = int(state.rng.choice(probs.shape[0], p=probs))
    return state.record(token)
