"""Decoder engine for language models: one preallocated KV cache per slot, written in place.

The cache is one buffer per layer and kind, [slots, kv_heads, context, head_dim], allocated and committed
once, at start, as llama.cpp and vLLM reserve theirs. The running sequences occupy slots 0..n-1, so a decode step
binds the first n rows of each buffer, as a view, as both the graph's past and its present (IO binding):
the graph writes one new position per row and nothing is copied. A prompt is prefilled into the slot
after the running ones, in chunks if the scheduler wants. When a sequence leaves, the last running slot
moves into its place (one copy of one sequence's cache, once), which keeps the running slots contiguous.
`lengths[row]` is what each slot holds.

Graphs: the builder's GroupQueryAttention graph for ONNX Runtime (builder/engine/decoder_graph.py), run
in place; and, for backends that cannot run ONNX Runtime's contrib ops (TensorRT), the grown-cache graph
(past in, present out), run through the same slot interface by copying (CopyingSlots).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.sessions import open_session


class DecoderEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, threads: int = 0, slots: int | None = None) -> None:
        self.config = config
        options = config.decoder
        self.layers, self.kv_heads, self.head_dim = options.layers, options.kv_heads, options.head_dim
        self.slots = slots or config.batching.max_batch
        self.context = int(config.max_seq_length)
        self.session: Any = open_session(model_dir, config, threads)
        names = {i.name for i in self.session.get_inputs()}
        self.in_place = "seqlens_k" in names
        kinds = ("key", "value")
        self.past = [f"past_{k}.{i}" if self.in_place else f"past.{i}.{k}" for i in range(self.layers) for k in kinds]
        expected = ({"input_ids", "seqlens_k", "total_sequence_length"} if self.in_place
                    else {"input_ids", "attention_mask", "position_ids"}) | set(self.past)
        if names != expected:
            raise BundleError(f"the engine takes inputs {sorted(names)}; a decoder with {self.layers} layers needs "
                              f"{sorted(expected)}")
        self.present = [name.replace("past", "present") for name in self.past]
        kv_type = next(i.type for i in self.session.get_inputs() if i.name == self.past[0])
        self.kv_dtype = np.dtype(np.float16 if kv_type == "tensor(float16)" else np.float32)
        self._bindings: dict[tuple[int, int], Any] = {}
        self.cache = self._committed_cache()
        self.lengths = np.zeros(self.slots, np.int64)

    def _committed_cache(self) -> list[np.ndarray]:
        """Every slot's buffers, written through (np.full) so the kernel commits their pages at start. Left to
        be committed on first use (np.zeros), a slot's first prefill paid for its whole buffer, since ONNX
        Runtime's attention touches all of it: +290 ms per slot on the 1B shape here (134 MB at ~0.5 GB/s on a
        VM), stalling a burst once per new slot. The plan's memory need already counts max_batch slots."""
        shape = (self.slots, self.kv_heads, self.context, self.head_dim)
        return [np.full(shape, 0, self.kv_dtype) for _ in self.past]

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    def run(self, first: int, ids: np.ndarray) -> np.ndarray:
        """Append ids [B,S] to slots first..first+B-1; returns each row's logits after its last new token."""
        rows = slice(first, first + ids.shape[0])
        if first < 0 or rows.stop > self.slots or ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"rows {first}..{rows.stop - 1}, tokens {ids.shape}: not within {self.slots} slots")
        lengths = self.lengths[rows] + ids.shape[1]
        if int(lengths.max()) > self.context:
            raise ValueError(f"a row would hold {int(lengths.max())} tokens, more than the context {self.context}")
        logits = self._in_place(rows, ids, lengths) if self.in_place else self._copying(rows, ids, lengths)
        self.lengths[rows] = lengths
        return logits

    def _binding(self, rows: slice) -> Any:
        """The rows' IO binding with their cache buffers bound once: binding 2 x layers buffers anew every step
        cost ~0.2 ms, 4% of a ~100M model's step. Kept per row range (the scheduler uses a few)."""
        key = (rows.start, rows.stop)
        binding = self._bindings.get(key)
        if binding is None:
            if len(self._bindings) >= 4 * self.slots:
                self._bindings.clear()
            binding = self._bindings[key] = self.session.io_binding()
            for past, present, buffer in zip(self.past, self.present, self.cache, strict=True):
                view = buffer[rows]  # the first rows of a C-contiguous array: contiguous, so bindable by pointer
                binding.bind_input(past, "cpu", 0, self.kv_dtype, list(view.shape), view.ctypes.data)
                binding.bind_output(present, "cpu", 0, self.kv_dtype, list(view.shape), view.ctypes.data)
        return binding

    def _in_place(self, rows: slice, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        binding = self._binding(rows)  # input_ids, seqlens_k, total_sequence_length and logits are bound anew
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, np.int64))
        binding.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(int(lengths.max()), np.int32))
        logits = np.empty((ids.shape[0], self.config.decoder.vocab_size), np.float32)
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self.session.run_with_iobinding(binding)
        return logits  # copy_outputs_to_cpu would also copy every bound cache buffer

    def _copying(self, rows: slice, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The grown-cache graph: rows' caches are right-padded to the longest, masked, then copied back."""
        new = ids.shape[1]
        held = self.lengths[rows]
        width = int(held.max())
        mask = np.zeros((len(held), width + new), np.int64)
        for row, length in enumerate(held):
            mask[row, :length] = 1
        mask[:, width:] = 1
        positions = held[:, None] + np.arange(new)[None, :]
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask, "position_ids": positions,
                 **{name: buffer[rows, :, :width] for name, buffer in zip(self.past, self.cache, strict=True)}}
        outputs = self.session.run(None, feeds)
        for buffer, present in zip(self.cache, outputs[1:], strict=True):
            for row, length in enumerate(held):
                buffer[rows.start + row, :, length:length + new] = present[row, :, width:]
        return np.asarray(outputs[0], np.float32)

    def move(self, source: int, target: int) -> None:
        """Slot `source`'s cache into slot `target` (which is overwritten); `source` is then empty."""
        if source == target:
            return
        length = int(self.lengths[source])
        for buffer in self.cache:
            buffer[target, :, :length] = buffer[source, :, :length]
        self.lengths[target], self.lengths[source] = length, 0

    def release(self, row: int) -> None:
        self.lengths[row] = 0

    def read(self, row: int, count: int) -> list[np.ndarray]:
        """A copy of the first `count` positions of a slot (for the prefix cache)."""
        return [buffer[row, :, :count].copy() for buffer in self.cache]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        """Fill a slot's first `count` positions from a prefix cache entry."""
        for buffer, block in zip(self.cache, blocks, strict=True):
            buffer[row, :, :count] = block[:, :count]
        self.lengths[row] = count

    def warm_up(self) -> None:
        rows = min(self.slots, 2)
        logits = self.run(0, np.array([[0, 1, 2]], np.int64))
        if rows == 2:
            self.run(1, np.array([[3]], np.int64))
            logits = self.run(0, np.array([[int(logits.argmax())], [4]], np.int64))
        for row in range(rows):
            self.release(row)  # what the warm-up wrote stays in the buffers, unread: a slot reads what it holds
        if logits.shape[0] != rows or not np.isfinite(logits).all():
            raise BundleError(f"warm-up produced logits of shape {logits.shape} or non-finite values")
