"""Encoder engine: token ids in, pooled sentence embeddings out, over any session backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.sessions import open_session


class EncoderEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, threads: int = 0) -> None:
        self.config = config
        self.session = open_session(model_dir, config, threads)
        names = {i.name for i in self.session.get_inputs()}
        if names != set(config.inputs):
            raise BundleError(f"the engine takes inputs {sorted(names)}, engine.json says {list(config.inputs)}")

    def run(self, batch: list[list[int]]) -> np.ndarray:
        """Pad the sequences to the longest and return one float32 row per sequence."""
        longest = max(len(ids) for ids in batch)
        ids = np.full((len(batch), longest), self.config.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        outputs = self.session.run([self.config.output], {k: feeds[k] for k in self.config.inputs})
        return np.asarray(outputs[0], dtype=np.float32)

    def warm_up(self) -> None:
        out = self.run([[self.config.pad_token_id] * 8, [self.config.pad_token_id] * 3])
        width = self.config.encoder.embedding_dim
        if out.shape != (2, width) or not np.isfinite(out).all():
            raise BundleError(f"warm-up produced {out.shape} (expected (2, {width})) or non-finite")
