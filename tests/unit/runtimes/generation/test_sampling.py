"""Next-token choice: greedy, seeded sampling, top-k/top-p, penalties, min_tokens."""

from __future__ import annotations

import numpy as np

from runtimes.generation.sampling import SamplerState, SamplingParams, next_token

LOGITS = np.array([0.1, 2.0, 1.5, -1.0, 1.9], dtype=np.float32)
EOS = (1,)


def pick(params: SamplingParams, logits: np.ndarray = LOGITS, prompt: list[int] | None = None,
         history: list[int] | None = None) -> int:
    state = SamplerState.start(params, prompt or [])
    for token in history or []:
        state.generated.append(token)
        state.counts[token] += 1
    return next_token(logits, state, ())


def test_greedy_takes_the_argmax() -> None:
    assert pick(SamplingParams(max_tokens=4, temperature=0)) == 1


def test_a_seed_reproduces_and_other_seeds_vary() -> None:
    def run(seed: int) -> list[int]:
        state = SamplerState.start(SamplingParams(max_tokens=64, temperature=1.0, seed=seed), [])
        return [next_token(LOGITS, state, ()) for _ in range(64)]

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(5)}) > 1


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    for seed in range(10):
        assert pick(SamplingParams(max_tokens=1, temperature=1.0, top_k=1, seed=seed)) == 1
        assert pick(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.01, seed=seed)) == 1


def test_top_k_keeps_only_the_k_best() -> None:
    chosen = {pick(SamplingParams(max_tokens=1, temperature=5.0, top_k=2, seed=s)) for s in range(200)}
    assert chosen == {1, 4}


def test_min_tokens_forbids_eos_until_reached() -> None:
    eos_first = np.array([0.0, 9.0, 1.0], dtype=np.float32)
    state = SamplerState.start(SamplingParams(max_tokens=4, temperature=0, min_tokens=2), [])
    assert [next_token(eos_first, state, EOS) for _ in range(3)] == [2, 2, 1]


def test_penalties_push_away_from_seen_tokens() -> None:
    assert pick(SamplingParams(max_tokens=1, temperature=0, repetition_penalty=2.0), prompt=[1]) == 4
    assert pick(SamplingParams(max_tokens=1, temperature=0, presence_penalty=0.5), history=[1]) == 4
    assert pick(SamplingParams(max_tokens=1, temperature=0, frequency_penalty=0.2), history=[1]) == 4
    assert pick(SamplingParams(max_tokens=1, temperature=0, frequency_penalty=0.01), history=[1]) == 1


def test_extreme_settings_fall_back_to_the_best_token() -> None:
    huge = np.array([1e30, 3e38, -1e30], dtype=np.float32)
    assert pick(SamplingParams(max_tokens=1, temperature=1e-6, seed=1), logits=huge) == 1
    assert pick(SamplingParams(max_tokens=1, temperature=1.0, repetition_penalty=0.01, seed=1), logits=huge,
                prompt=[2]) in {0, 1}
