"""Encoder engine, over any session backend: token ids in, one row per sequence out (a pooled sentence embedding)
or one score per (query, passage) pair (a cross-encoder's logit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.sessions import open_session
from runtimes.tokenize import Pair


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
