"""Encoder engine, over any session backend: token ids in, one row per sequence out (a pooled sentence embedding)
or one score per (query, passage) pair (a cross-encoder's logit). A batch whose attention scores would pass the
budget (runtimes/bundle/engine.py) runs as several calls, so no request's batch, nor the gate's, can hold more."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.bundle.engine import ATTENTION_BUDGET_BYTES, attention_bytes
from runtimes.engines.sessions import open_session
from runtimes.tokenize import Pair


def attention_calls(lengths: list[int], heads: int) -> list[list[int]]:
    """The session calls for sequences of these lengths: by length, each call's attention scores within
    ATTENTION_BUDGET_BYTES (padded to its longest) unless one sequence alone is over it; one call where heads is 0
    (an engine.json from before the budget)."""
    calls: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        cost = attention_bytes(heads, lengths[i])
        if not calls or cost * (len(calls[-1]) + 1) > ATTENTION_BUDGET_BYTES:
            calls.append([i])
        else:
            calls[-1].append(i)
    return calls


class EncoderEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, threads: int = 0) -> None:
        self.config = config
        self.session = open_session(model_dir, config, threads)
        names = {i.name for i in self.session.get_inputs()}
        if names != set(config.inputs):
            raise BundleError(f"the engine takes inputs {sorted(names)}, engine.json says {list(config.inputs)}")

    def run(self, batch: list[list[int]]) -> np.ndarray:
        """Pad the sequences to the longest and return one float32 row per sequence."""
        return self._run(batch, None)

    def score(self, pairs: list[Pair]) -> np.ndarray:
        """A reranker's logit per (query, passage) pair, with the pair's token types."""
        return self._run([p.ids for p in pairs], [p.types for p in pairs])

    def _run(self, batch: list[list[int]], types: list[list[int]] | None) -> np.ndarray:
        calls = attention_calls([len(ids) for ids in batch], self.config.attention_heads)
        if len(calls) == 1:
            return self._call(batch, types)
        out: np.ndarray | None = None
        for call in calls:
            rows = self._call([batch[i] for i in call], None if types is None else [types[i] for i in call])
            if out is None:
                out = np.empty((len(batch), *rows.shape[1:]), dtype=rows.dtype)
            out[call] = rows
        assert out is not None
        return out

    def _call(self, batch: list[list[int]], types: list[list[int]] | None) -> np.ndarray:
        longest = max(len(ids) for ids in batch)
        ids = np.full((len(batch), longest), self.config.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        kinds = np.zeros_like(ids)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
            if types is not None:
                kinds[row, : len(seq)] = types[row]
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": kinds}
        outputs = self.session.run([self.config.output], {k: feeds[k] for k in self.config.inputs})
        return np.asarray(outputs[0], dtype=np.float32)

    def warm_up(self) -> None:
        pad = self.config.pad_token_id
        want: tuple[int, ...]
        if self.config.task == "rerank":
            out, want = self.score([Pair([pad] * 8, [0] * 4 + [1] * 4), Pair([pad] * 3, [0] * 3)]), (2,)
        else:
            out, want = self.run([[pad] * 8, [pad] * 3]), (2, self.config.encoder.embedding_dim)
        if out.shape != want or not np.isfinite(out).all():
            raise BundleError(f"warm-up produced {out.shape} (expected {want}) or non-finite")
