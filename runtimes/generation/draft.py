"""Speculative decoding's other proposer: a draft model, a smaller decoder with the target's tokenizer, carried in
the same bundle (model/draft/, written by `mbuild package TARGET --draft DRAFT`).

The draft has its own engine, with the target's slots: a sequence keeps the same slot id in both. Its cache follows
the target's lazily. To propose k tokens for a slot it first runs what it has not seen of the sequence (the whole
prompt the first time, the last emitted token after that: one work, whatever its length), then k - 1 one-token
steps, every proposing slot in the same runs; each draft is the draft's greedy token. After the target verifies,
`keep` takes the draft's cache back to what the target kept: the rejected drafts' positions are a length, as in the
target (runtimes/engines/decoder.py). A draft proposal is one token with certainty, so the target's acceptance rule
(speculative.py) keeps the output's distribution.

The two may have different rows of logits over the one tokenizer (Qwen2.5-0.5B pads its embedding to 151,936 rows,
7B to 152,064, both over the same 151,665 tokens), as vLLM accepts: a draft proposes from the rows both have, so a
proposal is always a token the target can score; the build checked that the two tokenizers are the same.

The draft's failures stay with the draft: a run that fails gives that slot no drafts and forgets its draft cache
(it is rebuilt from the sequence next time); the request decodes on without speculation.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from runtimes.bundle import BundleError, load_engine_config
from runtimes.engines import decoder_for
from runtimes.engines.contract import SlotEngine
from runtimes.engines.decoder import DecoderEngine
from runtimes.engines.step import Work

log = logging.getLogger("mbuild.runtime")
TIMED_STEPS = 7  # one-token steps timed on each engine at load; their median prices a draft step


class DraftModel:
    """A draft engine's proposals; `pass_cost` is a draft step's time as a fraction of a target step's; `rows`, the
    logits' rows it proposes from (the ones it shares with the target; None: all of its own)."""

    def __init__(self, engine: SlotEngine, context: int, pass_cost: float, rows: int | None = None) -> None:
        self.engine, self.context, self.pass_cost, self.rows = engine, context, pass_cost, rows

    def room(self, tokens: int) -> int:
        """The most drafts a sequence of `tokens` tokens can get before the draft's context is full."""
        return self.context - tokens

    def propose(self, wants: dict[int, tuple[Sequence[int], int]]) -> dict[int, tuple[int, ...]]:
        """Per slot, (the sequence's tokens, k) -> k greedy draft tokens (none where the draft failed)."""
        drafts: dict[int, list[int]] = {slot: [] for slot in wants}
        works = []
        for slot, (tokens, _) in wants.items():
            held = int(self.engine.lengths[slot])
            if held >= len(tokens):  # never expected: it always lags by at least the last token
                self.engine.truncate(slot, held := len(tokens) - 1)
            if self.rows is not None and max(tokens[held:]) >= self.rows:  # an id of the target's padding only
                drafts.pop(slot)  # would fail the draft's run for every slot in it: this one goes without drafts
                continue
            works.append(Work(slot, tuple(tokens[held:])))
        while works:
            output = self.engine.step(works)
            for slot, error in output.errors.items():
                log.warning("draft model failed on slot %d (no drafts for it): %s", slot, error)
                self.engine.release(slot)
                drafts.pop(slot)
            for slot, logits in output.logits.items():
                drafts[slot].append(int(np.argmax(logits[-1][:self.rows])))
            works = [Work(slot, (made[-1],)) for slot, made in drafts.items() if len(made) < wants[slot][1]]
        return {slot: tuple(made) for slot, made in drafts.items()}

    def keep(self, slot: int, length: int) -> None:
        """The target kept `length` positions of the slot: the draft keeps no more."""
        if self.engine.lengths[slot] > length:
            self.engine.truncate(slot, length)

    def release(self, slot: int) -> None:
        self.engine.release(slot)


def step_seconds(engine: SlotEngine, slot: int = 0) -> float:
    """The median time of a one-token step on a slot holding a few tokens (the slot is released after)."""
    engine.step([Work(slot, (0, 1, 2))])
    times = []
    for _ in range(TIMED_STEPS):
        start = time.perf_counter()
        engine.step([Work(slot, (3,))])
        times.append(time.perf_counter() - start)
    engine.release(slot)
    return statistics.median(times)


def draft_cost(draft: SlotEngine, target: SlotEngine) -> float:
    """A draft step's time as a fraction of a target step's, measured here (threads, cache and core decide it)."""
    return step_seconds(draft) / step_seconds(target)


def open_draft(folder: Path, target: DecoderEngine, threads: int) -> DraftModel:
    """The draft engine in `folder` beside the target: the same tokenizer and slots, priced against it."""
    config = load_engine_config(folder)
    if config.task != "text-generation":
        raise BundleError(f"the draft model in {folder} is not a language model; rebuild with a draft that shares "
                          "the target's tokenizer")
    rows = min(config.decoder.vocab_size, target.config.decoder.vocab_size)
    engine = decoder_for(folder, config, threads, target.slots)
    if not engine.in_place:
        raise BundleError(f"the draft model in {folder} is not an in-place ONNX Runtime engine; rebuild it")
    engine.warm_up()
    target.warm_up()
    cost = draft_cost(engine, target)
    log.info("draft model: a step costs %.2f of the target's", cost)
    return DraftModel(engine, engine.context, cost, rows)
