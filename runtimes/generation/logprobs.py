"""Log-probabilities as OpenAI's logprobs report them: of the model's own distribution (the log-softmax of the
raw logits, before temperature, penalties and bias, as vLLM reports them by default), the chosen token's and
the k most likely."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # OpenAI's limit on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), most likely first


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    values = logits.astype(np.float64)
    peak = values.max()
    logprobs = values - (peak + np.log(np.exp(values - peak).sum()))
    k = min(max(top, 0), MAX_TOP, logprobs.shape[0])
    best = np.argpartition(-logprobs, k - 1)[:k] if k else np.array([], np.int64)
    best = best[np.argsort(-logprobs[best], kind="stable")]
    return TokenLogprob(token, float(logprobs[token]), tuple((int(i), float(logprobs[i])) for i in best))
