"""The scheduler: the sequences in the engine's slots, and the two decisions of each step: plan it, then apply
what the engine gave back. engine_loop.py runs it on the engine thread; tests drive it directly and assert on plans.

plan_step() returns a StepPlan under one token budget: every running sequence's decode token or verify row first
(never stalled by prompts), then prompt chunks in what is left, the prompts already filling first, then new ones
in free slots, each new one taking what the prefix cache holds of it (in place, in the slot its prefix was left in,
when there is one). A slot keeps its id from a sequence's first prompt token to its end; nothing moves when one
ends. Each row's state (rows.py: filling, running, paused, preempted, ended) changes only through its transitions;
a paused one (its reader MAX_UNREAD events behind) gets no work until it reads: it holds its slot, not more memory.

Every step fits the KV pool (kv_pool.py): a new prompt enters only when the pool holds all of it (first come,
first served: it waits first in the queue till then); which rows grow and which give their blocks up is
preemption.py's.

apply() takes the step's logits: prompts whose last chunk is in start decoding; a decode row emits a token; a verify
row emits the tokens its drafts earn (speculative.py) and takes its cache, and the draft model's, back past the
rejected ones. Every request ends with exactly one finishing event: its own sampling or engine failure ends it alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from runtimes.engines.contract import SlotEngine
from runtimes.engines.step import StepOutput
from runtimes.generation.draft import DraftModel
from runtimes.generation.guided import GuideError
from runtimes.generation.kv_pool import KvPool
from runtimes.generation.logprobs import token_logprob
from runtimes.generation.plan import SlotPlan, StepPlan
from runtimes.generation.preemption import Preemption
from runtimes.generation.prefix_cache import PrefixCache
from runtimes.generation.proposals import proposals
from runtimes.generation.requests import Event, FinishReason, Request
from runtimes.generation.rows import Row, RowStatus
from runtimes.generation.sampling import SamplerState, next_token
from runtimes.generation.speculative import RowSpeculation, Speculation
from runtimes.generation.waiting import Bounds, Waiting
from runtimes.metrics import Metrics
from runtimes.settings import PREFILL_CHUNK

log = logging.getLogger("mbuild.runtime")
PROMPT_LOGPROB_CHUNK = 64  # a prompt whose logprobs are asked gets every position's logits: smaller chunks


@dataclass(frozen=True)
class SchedulerConfig:
    eos_ids: tuple[int, ...]
    max_batch: int  # slots: sequences at once
    max_queue: int  # requests waiting for a slot; beyond, QueueFull
    context: int
    vocab: int
    prefill_chunk: int = PREFILL_CHUNK  # the step's token budget: decode and verify rows, then prompt chunks
    prefix_cache_bytes: int = 0
    kv_cache_bytes: int = 0  # the KV pool's size (0: every slot's whole context)
    chunked: bool = True  # False: a prompt runs whole, in one step (an engine that takes no chunk on a past)
    speculation: Speculation = field(default_factory=Speculation)


class Scheduler:
    def __init__(self, engine: SlotEngine, config: SchedulerConfig, metrics: Metrics,
                 draft: DraftModel | None = None) -> None:
        if (config.speculation.method == "draft") != (draft is not None):
            raise ValueError(f"speculation {config.speculation.method!r} with{'out' if draft is None else ''} a "
                             "draft model")
        self.engine, self.config, self.metrics = engine, config, metrics
        self.prefix = PrefixCache(config.prefix_cache_bytes, engine)
        self.pool = KvPool(engine, self.prefix, config.context, config.kv_cache_bytes)
        self.waiting = Waiting(Bounds(config.max_queue, config.context, self.pool.capacity_tokens, config.vocab))
        self.slots: list[Row | None] = [None] * config.max_batch
        self.draft = draft  # speculation's draft model, when it drafts with one (draft.py)
        self.preemption = Preemption(engine, self.pool, self.prefix, metrics, draft)

    @property
    def rows(self) -> list[Row]:
        return [row for row in self.slots if row is not None]

    @property
    def decoding(self) -> list[Row]:
        return [row for row in self.rows if row.decoding]

    @property
    def filling(self) -> list[Row]:
        """Rows filling their slot's cache, or waiting to (preempted), oldest first."""
        return sorted((row for row in self.rows if not row.decoding), key=lambda row: row.request.id)

    @property
    def free(self) -> bool:
        return None in self.slots

    # --- planning ----------------------------------------------------------------------------
    def plan_step(self) -> StepPlan:
        for row in self.rows:
            if row.request.cancelled:
                self.end(row, Event(finish="cancelled"))
            elif row.decoding:
                row.read_or_pause()
        running = [row for row in self.rows if row.status is RowStatus.RUNNING]
        plans = self.preemption.grown(self._decodes(running), self.rows, self.end)
        # prompts get what decoding leaves, and never less than a quarter, so they move however many rows decode
        room = max(self.config.prefill_chunk - sum(len(p.tokens) for p in plans), self.config.prefill_chunk // 4)
        for row in self.filling:
            if room <= 0 or not self._may_run(row, room, plans) or not self.preemption.claimed(row):
                break
            plans.append(self._chunk(row, room))
            room -= len(plans[-1].tokens)
        while room > 0 and self.free and (new := self._start()) is not None:
            if not self._may_run(new, room, plans):
                break  # it waits in its slot for the next step
            plans.append(self._chunk(new, room))
            room -= len(plans[-1].tokens)
        return StepPlan(tuple(plans), self.config.prefill_chunk)

    def _may_run(self, row: Row, room: int, plans: list[SlotPlan]) -> bool:
        """Whether the row's next chunk may go this step: always when chunks may be cut; else whole, within the
        room or as the step's one prompt past it (so it is never starved)."""
        return self.config.chunked or len(row.request.prompt) - row.filled <= room or \
            not any(plan.kind == "prefill" for plan in plans)

    def _decodes(self, rows: list[Row]) -> list[SlotPlan]:
        """Decode rows; those whose drafts are worth their cost (proposals.py) as verify rows."""
        hopeful = [(row, row.speculation, k) for row in rows if row.speculation is not None and (k := self._k(row))]
        drafts = proposals(hopeful, len(rows), self.config.speculation, self.draft)
        plans = []
        for row in rows:
            made = drafts.get(row.slot, ())
            plans.append(SlotPlan(row.slot, row.request.id, "verify" if made else "decode", (row.last, *made),
                                  1 + len(made), made))
        return plans

    def _k(self, row: Row) -> int:
        """How many drafts the row may take now: its speculation's k, within max_tokens and both contexts (the bonus
        token is the one more)."""
        spec, state = row.speculation, row.sampler
        if spec is None:
            return 0
        held = int(self.engine.lengths[row.slot])
        k = min(spec.k, state.params.max_tokens - len(state.generated) - 1, self.config.context - held - 1)
        if self.draft is not None:
            k = min(k, self.draft.room(len(state.prompt) + len(state.generated)))
        return max(k, 0)

    def _chunk(self, row: Row, room: int) -> SlotPlan:
        """The row's next prompt chunk; a refill after a preemption takes no logits (its next token is known)."""
        source, resumed = row.source, bool(row.sampler.generated)
        each = None if resumed else row.request.params.prompt_logprobs
        if each is not None and self.config.chunked:
            room = min(room, PROMPT_LOGPROB_CHUNK)
        piece = tuple(source[row.filled:row.filled + (room if self.config.chunked else len(source))])
        last = row.filled + len(piece) == len(source) and not resumed
        return SlotPlan(row.slot, row.request.id, "prefill", piece, len(piece) if each is not None else int(last))

    def _start(self) -> Row | None:
        """The next waiting request in a free slot (_slot_for), with what the prefix cache has of its prompt, when
        the pool holds its whole prompt (else it waits, first in the queue)."""
        chosen = [0]

        def fits(request: Request) -> bool:
            chosen[0] = self._slot_for(request)
            return self.pool.make_room(chosen[0], len(request.prompt) + 1)

        while (request := self.waiting.take(fits)) is not None:
            slot = chosen[0]
            try:  # one request's bad sampler settings end that request alone
                state = SamplerState.start(request.params, request.prompt)
            except Exception as exc:
                log.error("request %d: sampler setup failed: %s", request.id, exc)
                request.emit(Event(finish="error", error=f"sampler setup failed: {exc}"))
                continue
            s = self.config.speculation
            spec = RowSpeculation(s.most) if s.on and request.params.speculative else None
            row = Row(request, state, slot, spec)
            self.slots[slot] = row
            self.pool.reserve(slot, len(request.prompt) + 1)
            row.filled = self.preemption.restore(row)
            self.prefix.count(self.metrics, len(request.prompt), row.filled)
            return row
        return None

    def _slot_for(self, request: Request) -> int:
        """The free slot whose resident prefix holds most of the prompt (a conversation's next turn goes where its
        last one ended), else an empty one, else the one whose resident prefix was used longest ago."""
        free = [slot for slot, row in enumerate(self.slots) if row is None]
        if request.params.prompt_logprobs is None:
            best = self.prefix.best_slot(request.prompt, free)
            if best is not None:
                return best
        return self.prefix.coldest(free)

    # --- applying ----------------------------------------------------------------------------
    def apply(self, plan: StepPlan, output: StepOutput) -> None:
        now = time.perf_counter()
        for part in plan.rows:
            row = self.slots[part.slot]
            if row is None or row.request.id != part.request:
                continue  # ended since it was planned (shutdown)
            with row.request.together():
                if (error := output.errors.get(part.slot)) is not None:  # its run failed: the others go on
                    log.error("request %d: %s failed: %s", row.request.id, part.kind, error)
                    self.end(row, Event(finish="error", error=f"{part.kind} failed: {error}"))
                elif part.kind == "prefill":
                    self._prefilled(row, part, output.logits[part.slot], now)
                else:
                    self._emit(row, list(output.logits[part.slot]), part.drafts, now)

    def _prefilled(self, row: Row, part: SlotPlan, logits: np.ndarray, now: float) -> None:
        start, prompt = row.filled, row.request.prompt
        row.filled += len(part.tokens)
        if row.sampler.generated:  # a refill after a preemption: it decodes on from its last token
            if row.filled == len(row.source):
                row.filled_in()
            return
        each = row.request.params.prompt_logprobs
        if each is not None:  # the logits at position j score the prompt token after it
            row.prompt_logprobs += [token_logprob(logits[j], prompt[start + j + 1], each)
                                    for j in range(len(part.tokens)) if start + j + 1 < len(prompt)]
        if row.filled < len(prompt):
            return
        self.prefix.pin(row.slot, prompt)
        row.filled_in()
        row.request.admitted = True
        self.metrics.observe("time_to_first_token_seconds", now - row.request.enqueued)
        self.metrics.inc("tokens_total", len(prompt), kind="prompt")
        if each is not None:
            row.request.emit(Event(prompt_logprobs=tuple(row.prompt_logprobs)))
        self._emit(row, [logits[-1]], (), now)

    def _emit(self, row: Row, logits: list[np.ndarray], drafts: tuple[int, ...], now: float) -> None:
        """Tokens from each position's logits while the drafts are matched; the cache keeps the accepted ones."""
        held = int(self.engine.lengths[row.slot]) - len(drafts)  # the last token's position and before
        made, accepted, ended = 0, 0, None
        for j, position in enumerate(logits):
            token, ended = self._advance(row, position)
            made += 1
            if ended or j == len(drafts) or token != drafts[j]:
                break
            accepted += 1
        elapsed = (now - row.last_time) / made
        for _ in range(made if row.sampler.generated[made:] else made - 1):  # the first token's time is TTFT
            self.metrics.observe("time_per_output_token_seconds", elapsed)
        row.last_time = now
        if drafts:
            self._count(row, len(drafts), accepted)
        if row.speculation is not None:
            row.speculation.check(row.sampler.generated, self.config.speculation.most)
        if ended:
            self.end(row, Event(finish=ended))
        elif drafts:
            self.engine.truncate(row.slot, held + accepted)
            if self.draft is not None:
                self.draft.keep(row.slot, held + accepted)

    def _count(self, row: Row, drafted: int, accepted: int) -> None:
        assert row.speculation is not None
        row.speculation.record(drafted, accepted, self.config.speculation.most, self.draft is None)
        self.metrics.inc("spec_decode_drafts_total")
        self.metrics.inc("spec_decode_draft_tokens_total", drafted)
        self.metrics.inc("spec_decode_accepted_tokens_total", accepted)
        for position in range(accepted):
            self.metrics.inc("spec_decode_accepted_per_position_total", position=str(position))

    def _advance(self, row: Row, logits: np.ndarray) -> tuple[int | None, FinishReason | None]:
        """One token from one position's logits and its event; the reason the sequence ended, if it did."""
        request, params = row.request, row.request.params
        if request.cancelled:
            return None, "cancelled"
        try:
            token = next_token(logits, row.sampler, self.config.eos_ids)
        except Exception as exc:  # one request's sampling failure ends that request only
            log.error("request %d: sampling failed: %s", request.id, exc)
            self.end(row, Event(finish="error", error=f"sampling failed: {exc}", refused=isinstance(exc, GuideError)))
            return None, "error"
        row.last = token
        self.metrics.inc("tokens_total", 1, kind="completion")
        # Sampling never picks these before min_tokens, so meeting one here always ends the sequence.
        if token in params.stop_token_ids or (token in self.config.eos_ids and not params.ignore_eos):
            return token, "stop"
        chosen = None if params.logprobs is None else token_logprob(logits, token, params.logprobs)
        request.emit(Event(token=token, logprob=chosen))  # stop strings are matched on text by the consumer
        if row.sampler.complete:  # the grammar's output is whole
            return token, "stop"
        return token, "length" if len(row.sampler.generated) >= params.max_tokens else None

    def end(self, row: Row, event: Event) -> None:
        """The sequence's one finishing event, and its slot free (once: a row already ended is left alone)."""
        if self.slots[row.slot] is not row:
            return
        if row.speculation is not None:
            event.drafted, event.accepted = row.speculation.drafted, row.speculation.accepted
        row.end()
        row.request.emit(event)
        self.slots[row.slot] = None
        # kept for a next turn: the positions that hold its tokens (not the last, never run; nor a verify row's
        # rejected drafts, past it, when the sequence ended in one)
        self.prefix.pin(row.slot, row.tokens[:min(int(self.engine.lengths[row.slot]), len(row.tokens) - 1)])
        self.engine.release(row.slot)
        self.pool.release(row.slot)
        if self.draft is not None:
            self.draft.release(row.slot)

    def fail(self, reason: str) -> None:
        for row in self.rows:
            self.end(row, Event(finish="error", error=reason))
