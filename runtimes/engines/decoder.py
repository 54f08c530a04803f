"""Decoder engine for language models: one reserved KV cache per slot, written in place.

The cache is one buffer per layer and kind, [slots, kv_heads, context, head_dim] (the layer's: layers may differ,
engine.json's options.cache_shapes), reserved once, at start, and
committed only where positions are written (kv_memory.py): `written[slot]` is how far a slot's pages reach, and
`forget` hands back those past a position (the KV pool decides when: runtimes/generation/kv_pool.py). Slots have
fixed ids: a sequence keeps its slot from its first prompt token to its end, and nothing is copied when it leaves.
A step is a list of works (step.py: per slot, tokens to append and how many logits come back), packed into runs
over contiguous slot ranges; each run binds those rows of every buffer, as a view, as both the graph's past and its
present (IO binding), so the graph writes the new positions and nothing is copied. `lengths[slot]` is what each
slot holds; `truncate` takes positions back (speculative decoding's rejected drafts), which is only a length.

Graphs: the builder's GroupQueryAttention graph for ONNX Runtime (builder/engine/decoder_graph.py), run in place;
and, for backends that cannot run ONNX Runtime's contrib ops (TensorRT), the grown-cache graph (past in, present
out), run through the same works by copying.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.bundle import BundleError, EngineConfig
from runtimes.engines.kv_memory import KvBuffer
from runtimes.engines.sessions import open_session
from runtimes.engines.states import States
from runtimes.engines.step import Run, StepOutput, Work, one_at_a_time, pack, start, unsupported

# the graph's metadata entry that says its pasts are right-aligned (builder/engine/generic/grown.py)
PAST_LAYOUT, RIGHT_ALIGNED = "mbuild.past_layout", "right_aligned"
# and the one that lists the layers whose values are their keys ("0,1,..."): multi-head latent attention's cached
# latent (builder/engine/generic/latent.py), held once for both
VALUES_ARE_KEYS = "mbuild.values_are_keys"


def _metadata(session: Any) -> dict[str, str]:
    """The graph's metadata entries; none where the session does not say (a stand-in in tests)."""
    meta = getattr(session, "get_modelmeta", None)
    return dict(meta().custom_metadata_map) if meta is not None else {}


def _shared_layers(session: Any) -> frozenset[int]:
    listed = _metadata(session).get(VALUES_ARE_KEYS, "")
    return frozenset(int(layer) for layer in listed.split(",") if layer.strip().isdigit())


def _right_aligned(past: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Rows' first held[row] positions moved to end at the past's width (zeros before them)."""
    out = np.zeros_like(past)
    width = past.shape[2]
    for row, length in enumerate(held):
        out[row, :, width - length:] = past[row, :, :length]
    return out


def _check_shapes(session: Any, past: list[str], shapes: list[tuple[int, int]]) -> None:
    """The graph's caches are the shapes engine.json says, where the graph fixes them (ONNX Runtime's graphs do): a
    mismatch would fail at the first step, or read past a buffer's end."""
    declared = {i.name: getattr(i, "shape", None) for i in session.get_inputs()}
    for name, (heads, dim) in zip(past, shapes, strict=True):
        shape = declared.get(name)
        if not isinstance(shape, (list, tuple)) or len(shape) != 4:
            continue
        fixed = [(want, got) for want, got in ((heads, shape[1]), (dim, shape[3])) if isinstance(got, int)]
        if any(want != got for want, got in fixed):
            raise BundleError(f"the graph's {name} is {list(shape)}, but engine.json gives the layer's cache "
                              f"{heads} KV heads of {dim}")


class DecoderEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, threads: int = 0, slots: int | None = None) -> None:
        self.config = config
        options = config.decoder
        self.layers, self.kv_heads, self.head_dim = options.layers, options.kv_heads, options.head_dim  # most layers'
        self.slots = slots or config.batching.max_batch
        self.context = int(config.max_seq_length)
        self.session: Any = open_session(model_dir, config, threads)
        names = {i.name for i in self.session.get_inputs()}
        self.in_place = "seqlens_k" in names
        kinds = ("key", "value")
        self.past = [f"past_{k}.{i}" if self.in_place else f"past.{i}.{k}" for i in range(self.layers) for k in kinds]
        self.states = States(self.session, self.slots)  # none but in a grown-cache graph of a recurrent model
        ids_shape = next(getattr(i, "shape", None) for i in self.session.get_inputs() if i.name == "input_ids")
        self.one_token = isinstance(ids_shape, (list, tuple)) and len(ids_shape) == 2 and ids_shape[1] == 1
        expected = ({"input_ids", "seqlens_k", "total_sequence_length"} if self.in_place
                    else {"input_ids", "attention_mask", "position_ids"}) | {"logits_at", *self.past}
        expected |= set(self.states.names)
        if names != expected or not (self.layers or self.states):  # a decoder holds a cache, a state or both
            raise BundleError(f"the engine takes inputs {sorted(names)}; a decoder with {self.layers} layers needs "
                              f"{sorted(expected)}")
        self.present = [name.replace("past", "present") for name in self.past]
        # a grown-cache graph that places keys by their index in the cache (the generic export's) takes each row's
        # past right-aligned, ending where its new tokens start; TensorRT's takes it left-aligned, slot j position j
        self.right_aligned = not self.in_place and _metadata(self.session).get(PAST_LAYOUT) == RIGHT_ALIGNED
        kv_type = next((i.type for i in self.session.get_inputs() if i.name in self.past[:1]), "tensor(float)")
        # an 8-bit cache (builder/engine/kv_cache_quant.py) is int8 in and out; the graph holds its scales
        self.kv_dtype = np.dtype({"tensor(float16)": np.float16, "tensor(int8)": np.int8}.get(kv_type, np.float32))
        self._bindings: dict[tuple[int, int], Any] = {}
        shapes = [shape for shape in options.cache_shapes for _ in kinds]  # the past's order: key.0, value.0, ...
        _check_shapes(self.session, self.past, shapes)
        shared = _shared_layers(self.session) if self.in_place else frozenset()
        self._buffers: list[KvBuffer] = []
        for i, (heads, dim) in enumerate(shapes):
            # a layer whose values are its keys has one buffer, bound as both: the graph writes the same values to
            # the same positions through either name (an 8-bit cache's scales are the same too: kv_cache_quant.py)
            layer, value = divmod(i, 2)
            self._buffers.append(self._buffers[-1] if value and layer in shared
                                 else KvBuffer((self.slots, heads, self.context, dim), self.kv_dtype))
        self._held = list({id(buffer): buffer for buffer in self._buffers}.values())  # each buffer once
        # every buffer's heads, a token; counted once, the pool reads it per admission
        self._bytes_per_token = sum(b.array.shape[1] * b.array.shape[3] for b in self._held) * self.kv_dtype.itemsize
        self.cache = [buffer.array for buffer in self._buffers]  # per past input, as the graph names them
        self.lengths = np.zeros(self.slots, np.int64)
        self.written = np.zeros(self.slots, np.int64)  # per slot, the positions its pages may hold (padding too)
        self.kept = np.zeros(self.slots, np.int64)  # per free slot, the positions its last sequence left (step.py)
        self.warmed = False

    @property
    def block_shapes(self) -> list[tuple[int, int]]:
        """(KV heads, head size) of each block `read` gives and `write` takes: one a buffer."""
        return [(buffer.array.shape[1], buffer.array.shape[3]) for buffer in self._held]

    @property
    def bytes_per_token(self) -> int:
        return self._bytes_per_token

    def step(self, works: Sequence[Work]) -> StepOutput:
        """Append each work's tokens to its slot; per work, the logits [work.logits, vocab] of its last positions,
        or the error of the run it was in (which leaves that run's slots as they were: the others are unaffected,
        since a run writes only past its rows' lengths)."""
        for work in works:
            if work.slot >= self.slots:
                raise ValueError(f"slot {work.slot}: there are {self.slots}")
        refused = {work.slot: error for work in works if (error := unsupported(work)) is not None}
        works = [work for work in works if work.slot not in refused]
        if self.one_token and any(len(work.tokens) > 1 for work in works):
            return StepOutput.of({**self._token_by_token(works), **refused})
        got: dict[int, np.ndarray | Exception] = dict(refused)
        for run in pack(works, self.lengths.tolist(), self.context, self.kept.tolist(), equal=bool(self.states)):
            span = slice(run.first, run.first + len(run.rows))
            # where each row writes, now: an earlier run of the step may have advanced a slot
            at = np.array([start(int(length), int(kept), work is not None) for work, length, kept
                           in zip(run.rows, self.lengths[span], self.kept[span], strict=True)], np.int64)
            self.written[span] = np.maximum(self.written[span], at + run.width)
            try:
                got.update(self._run(run, at))
            except Exception as exc:  # the caller ends the run's requests with it
                got.update({work.slot: exc for work in run.rows if work is not None})
        return StepOutput.of(got)

    def _token_by_token(self, works: Sequence[Work]) -> dict[int, np.ndarray | Exception]:
        """The works as steps of one token each, for a graph that takes one a run; a work's logits joined, or the
        first error of its runs (it takes no more runs)."""
        logits: dict[int, list[np.ndarray]] = {work.slot: [] for work in works}
        failed: dict[int, Exception] = {}
        for tokens in one_at_a_time(works):
            output = self.step([work for work in tokens if work.slot not in failed])
            failed |= output.errors
            for slot, got in output.logits.items():
                logits[slot].append(got)
        return {w.slot: failed[w.slot] if w.slot in failed else np.concatenate(logits[w.slot]) for w in works}

    def run(self, first: int, ids: np.ndarray) -> np.ndarray:
        """Append ids [B,S] to slots first..first+B-1; returns each row's logits after its last new token."""
        if first < 0 or first + ids.shape[0] > self.slots or ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"rows {first}..{first + ids.shape[0] - 1}, tokens {ids.shape}: not within {self.slots} "
                             "slots")
        works = [Work(first + row, tuple(int(t) for t in ids[row])) for row in range(ids.shape[0])]
        output = self.step(works)
        if output.errors:
            raise next(iter(output.errors.values()))
        return np.concatenate([output.logits[work.slot] for work in works])

    def _run(self, run: Run, at: np.ndarray) -> dict[int, np.ndarray]:
        rows = slice(run.first, run.first + len(run.rows))
        ids = np.zeros((len(run.rows), run.width), np.int64)  # padding: token 0, past each row's real tokens
        picks: list[int] = []
        for row, work in enumerate(run.rows):
            if work is not None:
                ids[row, :len(work.tokens)] = work.tokens
                picks += range(row * run.width + len(work.tokens) - work.logits, row * run.width + len(work.tokens))
        picked = np.array(picks, np.int64)
        logits = self._in_place(rows, ids, picked, at) if self.in_place else self._copying(rows, ids, picked, run)
        out, taken = {}, 0
        for work in run.rows:
            if work is not None:
                out[work.slot] = logits[taken:taken + work.logits]
                taken += work.logits
                self.lengths[work.slot] += len(work.tokens)
                self.kept[work.slot] = 0  # it holds a live sequence (a draft engine's slots are never `keep`'s)
        return out

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
                view = buffer[rows]  # rows of a C-contiguous array: contiguous, so bindable by pointer
                binding.bind_input(past, "cpu", 0, self.kv_dtype, list(view.shape), view.ctypes.data)
                binding.bind_output(present, "cpu", 0, self.kv_dtype, list(view.shape), view.ctypes.data)
        return binding

    def _in_place(self, rows: slice, ids: np.ndarray, picked: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Every row of the range takes the run's width from `at` (a work's at its length, the padding after its
        real tokens; a row without work past what its slot holds or keeps)."""
        lengths = at + ids.shape[1]
        binding = self._binding(rows)  # input_ids, seqlens_k, total_sequence_length, logits_at, logits: anew
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(int(lengths.max()), np.int32))
        binding.bind_cpu_input("logits_at", picked)
        logits = np.empty((len(picked), self.config.decoder.vocab_size), np.float32)
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self.session.run_with_iobinding(binding)
        return logits  # copy_outputs_to_cpu would also copy every bound cache buffer

    def _copying(self, rows: slice, ids: np.ndarray, picked: np.ndarray, run: Run) -> np.ndarray:
        """The grown-cache graph: rows' caches are right-padded to the longest, masked, then each row's real new
        positions copied back."""
        new = ids.shape[1]
        held = self.lengths[rows]
        width = int(held.max())
        mask = np.zeros((len(held), width + new), np.int64)
        for row, length in enumerate(held):
            mask[row, width - length if self.right_aligned else 0:][:length] = 1
        mask[:, width:] = 1
        positions = held[:, None] + np.arange(new)[None, :]
        pasts = [buffer[rows, :, :width] for buffer in self.cache]
        if self.right_aligned and (held != width).any():  # a copy, each row's past moved to end at width
            pasts = [_right_aligned(past, held) for past in pasts]
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "logits_at": picked,
                 **dict(zip(self.past, pasts, strict=True)), **self.states.feeds(rows, held)}
        outputs = self.session.run(None, feeds)
        kv = len(self.cache)
        self.states.store(rows, run.rows, run.width, outputs[1 + kv:])
        for buffer, present in zip(self.cache, outputs[1:1 + kv], strict=True):
            for row, (length, work) in enumerate(zip(held, run.rows, strict=True)):
                if work is not None:
                    buffer[rows.start + row, :, length:length + len(work.tokens)] = \
                        present[row, :, width:width + len(work.tokens)]
        return np.asarray(outputs[0], np.float32)

    def truncate(self, slot: int, length: int) -> None:
        """Keep a slot's first `length` positions (what lies past them is overwritten by its next tokens)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions, not {length}")
        if self.states and length != self.lengths[slot]:
            raise ValueError("a recurrent state cannot be taken back to an earlier position")
        self.lengths[slot] = length

    def release(self, row: int) -> None:
        """The slot is free; its positions stay (kept: padding goes past them) and its pages committed, for its next
        sequence, until `forget` takes them."""
        self.kept[row] = self.lengths[row]
        self.lengths[row] = 0

    def forget(self, slot: int, keep: int) -> None:
        """Hand back the memory of the slot's positions from `keep` on (at most its length stays meaningful)."""
        keep = max(keep, 0)
        self.kept[slot] = min(self.kept[slot], keep)
        if self.written[slot] > keep:
            for buffer in self._held:
                buffer.forget(slot, keep, int(self.written[slot]))
            self.written[slot] = keep

    def read(self, row: int, count: int) -> list[np.ndarray]:
        """A copy of the first `count` positions of a slot (for the prefix cache), a block per buffer."""
        return [buffer.array[row, :, :count].copy() for buffer in self._held]

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        """Fill a slot's first `count` positions from a prefix cache entry's copy."""
        for buffer, block in zip(self._held, blocks, strict=True):
            buffer.array[row, :, :count] = block[:, :count]
        self.keep(row, count)

    def copy(self, source: int, row: int, count: int) -> None:
        """Fill a slot's first `count` positions from another slot's (a prefix resident there)."""
        for buffer in self._held:
            buffer.array[row, :, :count] = buffer.array[source, :, :count]
        self.keep(row, count)

    def keep(self, row: int, count: int) -> None:
        """The slot's next sequence holds its first `count` positions as they are (a prefix left in it, or just
        written); what lay past them is no longer kept."""
        if self.states and count:
            raise ValueError("a recurrent state cannot start a sequence part way (no prefix is kept for it)")
        self.lengths[row], self.kept[row] = count, 0
        self.written[row] = max(self.written[row], count)

    def warm_up(self) -> None:
        """Run the first steps once, so the first request does not pay for them; again is a no-op (a draft model
        warms its target up before pricing it, and the server warms what it loaded)."""
        if self.warmed:
            return
        rows = min(self.slots, 2)
        logits = self.run(0, np.array([[0, 1, 2]], np.int64))
        if rows == 2:
            self.run(1, np.array([[3]], np.int64))
            logits = self.run(0, np.array([[int(logits.argmax())], [4]], np.int64))
        for row in range(rows):
            self.release(row)
            self.forget(row, 0)  # a ready server holds no cache pages
        if logits.shape[0] != rows or not np.isfinite(logits).all():
            raise BundleError(f"warm-up produced logits of shape {logits.shape} or non-finite values")
        self.warmed = True
