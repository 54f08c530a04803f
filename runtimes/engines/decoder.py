"""Decoder engine for language models, with the KV cache as explicit tensors, over any session backend.

The graph (exported by mbuild) takes input_ids [B,S], attention_mask [B,P+S] (0 marks a padding
slot), position_ids [B,S] and past.{i}.key/value [B,kv_heads,P,head_dim]; it returns the last
position's logits [B,vocab] and present.{i}.key/value [B,kv_heads,P+S,head_dim]. Rows may have
different lengths: each is left-padded, masked, and keeps its own positions, which is what lets the
scheduler add and remove sequences between decode steps (continuous batching).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.sessions import open_session


@dataclass
class Batch:
    """The running batch's cache: one K and one V array per layer, a mask, and each row's next position."""

    kv: list[np.ndarray]
    mask: np.ndarray  # [B, T] int64
    positions: np.ndarray  # [B] int64

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])


def _pad_left(array: np.ndarray, width: int, axis: int) -> np.ndarray:
    if width == 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[axis] = (width, 0)
    return np.pad(array, pad)


class DecoderEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, threads: int = 0) -> None:
        self.config = config
        options = config.options
        try:
            self.layers = int(options["layers"])
            self.kv_heads = int(options["kv_heads"])
            self.head_dim = int(options["head_dim"])
        except KeyError as exc:
            raise BundleError(f"engine.json lacks decoder option {exc}") from exc
        self.session = open_session(model_dir, config, threads)
        self.past_names = [f"past.{i}.{kind}" for i in range(self.layers) for kind in ("key", "value")]
        expected = {"input_ids", "attention_mask", "position_ids", *self.past_names}
        found = {i.name for i in self.session.get_inputs()}
        if found != expected:
            raise BundleError(f"the engine takes inputs {sorted(found)}; a decoder with {self.layers} layers needs "
                              f"{sorted(expected)}")

    def empty(self, rows: int) -> Batch:
        shape = (rows, self.kv_heads, 0, self.head_dim)
        return Batch([np.zeros(shape, np.float32) for _ in self.past_names], np.zeros((rows, 0), np.int64),
                     np.zeros(rows, np.int64))

    def _run(self, batch: Batch, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, Batch]:
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                 **dict(zip(self.past_names, batch.kv, strict=True))}
        outputs = self.session.run(None, feeds)
        next_positions = positions[:, -1] + 1
        return np.asarray(outputs[0], np.float32), Batch(list(outputs[1:]), mask, next_positions)

    def prefill(self, prompts: list[list[int]]) -> tuple[np.ndarray, Batch]:
        """Run new prompts (left-padded together); returns their last logits and their cache."""
        longest = max(len(p) for p in prompts)
        ids = np.zeros((len(prompts), longest), np.int64)
        mask = np.zeros((len(prompts), longest), np.int64)
        positions = np.zeros((len(prompts), longest), np.int64)
        for row, prompt in enumerate(prompts):
            start = longest - len(prompt)
            ids[row, start:] = prompt
            mask[row, start:] = 1
            positions[row, start:] = np.arange(len(prompt))
        return self._run(self.empty(len(prompts)), ids, mask, positions)

    def decode(self, batch: Batch, tokens: np.ndarray) -> tuple[np.ndarray, Batch]:
        """One step for every row: each row's last token in, its next logits out."""
        mask = np.concatenate([batch.mask, np.ones((batch.size, 1), np.int64)], axis=1)
        return self._run(batch, tokens.reshape(-1, 1).astype(np.int64), mask, batch.positions.reshape(-1, 1))

    @staticmethod
    def merge(running: Batch | None, joining: Batch) -> Batch:
        """Append rows to the batch, left-padding whichever cache is shorter."""
        if running is None or running.size == 0:
            return joining
        length = max(running.length, joining.length)
        a_pad, b_pad = length - running.length, length - joining.length
        kv = [np.concatenate([_pad_left(a, a_pad, 2), _pad_left(b, b_pad, 2)], axis=0)
              for a, b in zip(running.kv, joining.kv, strict=True)]
        mask = np.concatenate([_pad_left(running.mask, a_pad, 1), _pad_left(joining.mask, b_pad, 1)], axis=0)
        return Batch(kv, mask, np.concatenate([running.positions, joining.positions]))

    @staticmethod
    def keep(batch: Batch, rows: list[int]) -> Batch:
        """Only these rows, with columns no remaining row uses trimmed from the left."""
        mask = batch.mask[rows]
        used = np.flatnonzero(mask.any(axis=0))
        start = int(used[0]) if used.size else mask.shape[1]
        return Batch([layer[rows, :, start:] for layer in batch.kv], mask[:, start:], batch.positions[rows])

    def warm_up(self) -> None:
        logits, batch = self.prefill([[0, 1, 2], [3]])
        logits, _ = self.decode(batch, logits.argmax(-1))
        if logits.shape[0] != 2 or not np.isfinite(logits).all():
            raise BundleError(f"warm-up produced logits of shape {logits.shape} or non-finite values")
