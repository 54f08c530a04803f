"""One engine step as plain data, and how the runner packs it into ONNX Runtime calls.

A step is a list of Work: per slot, the tokens appended to its cache (one decode token, a prefill chunk, or a
verify row of the last token and its drafts) and how many of its last positions' logits come back (0 for a prompt
chunk that is not its last, 1 for a decode or a last chunk, more for a verify row or prompt logprobs).

The runner packs works into runs. A run is one session call over a contiguous range of slots, every row right-padded
to the run's width: a row's new tokens land at its own length, the padding after them, where the causal mask keeps
it from any real token, and the slot's length then advances by its real tokens only, so what the padding wrote lies
past the length and is overwritten later. Slots in the range that have no work this step (free, paused, or worked in
another run) are padded whole. ONNX Runtime's CPU GroupQueryAttention takes one new-token count per call, which is why
a 512-token chunk and sixteen decode rows are not one call: the decode rows would each compute 512 positions. The
packing weighs that padding against one more pass over the weights (PASS_TOKENS).

A slot with no work in a run is padded past what it holds (`starts`): its length, or, when free, the positions its
last sequence left there (`kept`: a prefix the next one may go on from, runtimes/generation/prefix_cache.py), which
padding at 0 would overwrite.

And a run wider than one token spans one slot unless every slot in it is empty: ONNX Runtime 1.32's CPU
GroupQueryAttention refuses more ("batch_size must be 1 when sequence_length > 1 and past context is given",
measured; mbuild's CausalAttention takes it, but a graph may hold either, so runs are packed for both). So decode
rows share a run whatever their lengths, first chunks of new prompts share one when their
slots are side by side, and a later chunk or a verify row runs alone: one more pass over the weights each, which
the scheduler weighs before it speculates (generation/speculative.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# A pass over the weights, in padded tokens' compute: what one more run costs beside the tokens it carries. On this
# design's CPU step a decode token reads the whole model once (docs/benchmarks/llm_peer.md), so a few padded rows
# are cheaper than a second read; the constant only decides how works are packed, never what they compute.
PASS_TOKENS = 16


@dataclass(frozen=True)
class Work:
    """One slot's part of a step. `adapter` and `embeddings` are per-row inputs an engine may take (LoRA adapters,
    a vision tower's image embeddings); one that takes neither fails such a row alone (`unsupported`)."""

    slot: int
    tokens: tuple[int, ...]
    logits: int = 1  # the last this-many new positions' logits come back
    adapter: str | None = None  # the LoRA adapter the row runs with; None: the base model
    # [len(tokens), hidden]: input embeddings in place of the tokens' own; None: the tokens' own
    embeddings: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.tokens or not 0 <= self.logits <= len(self.tokens) or self.slot < 0:
            raise ValueError(f"slot {self.slot}: {len(self.tokens)} tokens cannot give {self.logits} logits")
        if self.embeddings is not None and self.embeddings.shape[:1] != (len(self.tokens),):
            raise ValueError(f"slot {self.slot}: embeddings {self.embeddings.shape} for {len(self.tokens)} tokens")


def unsupported(work: Work) -> Exception | None:
    """The row's error for an engine that serves the base model on token ids only (every engine, so far)."""
    if work.adapter is not None:
        return ValueError(f"this engine serves no adapters (asked: {work.adapter!r})")
    if work.embeddings is not None:
        return ValueError("this engine takes no input embeddings")
    return None


@dataclass(frozen=True)
class StepOutput:
    """What a step gives back, by slot: each work's logits [work.logits, vocab], or the error of the run it was in
    (that row alone ends; the others are unaffected)."""

    logits: Mapping[int, np.ndarray]
    errors: Mapping[int, Exception] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if both := set(self.logits) & set(self.errors):
            raise ValueError(f"slots {sorted(both)} have logits and an error")

    @classmethod
    def of(cls, results: Mapping[int, np.ndarray | Exception]) -> StepOutput:
        return cls({s: r for s, r in results.items() if not isinstance(r, Exception)},
                   {s: r for s, r in results.items() if isinstance(r, Exception)})


@dataclass(frozen=True)
class Run:
    """One session call: slots first..first+len(rows)-1, each row's work or None (padded whole), `width` tokens."""

    first: int
    rows: tuple[Work | None, ...]
    width: int

    @property
    def padded(self) -> int:
        return len(self.rows) * self.width


def _cost(works: Sequence[Work]) -> int:
    slots = [w.slot for w in works]
    return PASS_TOKENS + (max(slots) - min(slots) + 1) * max(len(w.tokens) for w in works)


def start(length: int, kept: int, worked: bool) -> int:
    """Where a slot's row of a run writes: a work at the slot's length, padding past what it holds or keeps."""
    return length if worked else max(length, kept)


def _fits(works: Sequence[Work], base: Sequence[int], context: int, widths: dict[int, int]) -> bool:
    """Every slot in the range has room for the padded width past where its row starts (`base`, after its own work
    when another run of the step does it: that one may run first), and a run wider than one token over several slots
    finds them all empty (see the module docstring) when it runs: none may be worked by another run, which may fill
    it."""
    slots = {w.slot for w in works}
    width = max(len(w.tokens) for w in works)
    span = range(min(slots), max(slots) + 1)
    at = [base[s] + (widths.get(s, 0) if s not in slots else 0) for s in span]
    taken = [a or (s in widths and s not in slots) for s, a in zip(span, at, strict=True)]
    if width > 1 and len(span) > 1 and any(taken):
        return False
    return all(a + width <= context for a in at)


def pack(works: Sequence[Work], lengths: Sequence[int], context: int, kept: Sequence[int] | None = None,
         equal: bool = False) -> list[Run]:
    """Works into runs, narrowest first: a work joins the current run when the merged run costs no more than the
    two apart and every slot it spans has room for the padding; else it starts a run. Each slot once per step.
    kept: per slot, the positions a free slot keeps (none when not given). equal: a run's works carry as many
    tokens each, none padded (a graph with recurrent state: runtimes/engines/states.py)."""
    if len({w.slot for w in works}) != len(works):
        raise ValueError("a step holds at most one work per slot")
    groups: list[list[Work]] = []
    widths = {w.slot: len(w.tokens) for w in works}
    kept = kept or [0] * len(lengths)
    base = [start(length, kept[slot], slot in widths) for slot, length in enumerate(lengths)]
    for work in sorted(works, key=lambda w: (len(w.tokens), w.slot)):
        if lengths[work.slot] + len(work.tokens) > context:
            raise ValueError(f"slot {work.slot} holds {lengths[work.slot]} tokens: {len(work.tokens)} more "
                             f"exceed the context {context}")
        if groups:
            merged = [*groups[-1], work]
            if equal and len(work.tokens) != len(groups[-1][0].tokens):
                groups.append([work])
                continue
            if _cost(merged) <= _cost(groups[-1]) + _cost([work]) and _fits(merged, base, context, widths):
                groups[-1] = merged
                continue
        groups.append([work])
    runs = []
    for group in groups:
        by_slot = {w.slot: w for w in group}
        first, last = min(by_slot), max(by_slot)
        runs.append(Run(first, tuple(by_slot.get(s) for s in range(first, last + 1)),
                        max(len(w.tokens) for w in group)))
    return runs


def one_at_a_time(works: Sequence[Work]) -> list[list[Work]]:
    """A step's works as steps of one token a work, in order (a graph that takes one new token a run: a model with
    recurrent state, runtimes/engines/states.py): the i-th of each work that has one, with its logit where the work
    asked for that position's."""
    longest = max((len(w.tokens) for w in works), default=0)
    return [[Work(w.slot, (w.tokens[i],), int(i >= len(w.tokens) - w.logits)) for w in works if i < len(w.tokens)]
            for i in range(longest)]
