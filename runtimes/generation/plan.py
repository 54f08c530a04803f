"""A planned engine step as plain data: what each slot runs this step, and why.

The scheduler (scheduler.py) makes one with plan_step(), the engine runs its works as one step
(runtimes/engines/step.py), and apply() takes its output back; tests assert on plans, not on the engine's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runtimes.engines.step import Work

Kind = Literal["prefill", "decode", "verify"]


@dataclass(frozen=True)
class SlotPlan:
    """One slot's part: a prompt chunk, a decode token, or a verify row (the last token, then its drafts)."""

    slot: int
    request: int  # the request's id
    kind: Kind
    tokens: tuple[int, ...]
    logits: int  # how many of the last positions' logits come back
    drafts: tuple[int, ...] = ()

    @property
    def work(self) -> Work:
        return Work(self.slot, self.tokens, self.logits)


@dataclass(frozen=True)
class StepPlan:
    rows: tuple[SlotPlan, ...]
    budget: int  # the token budget it was planned under (decode and verify rows always run; prompts fill the rest)

    @property
    def tokens(self) -> int:
        return sum(len(row.tokens) for row in self.rows)

    def of(self, kind: Kind) -> list[SlotPlan]:
        return [row for row in self.rows if row.kind == kind]

    def __bool__(self) -> bool:
        return bool(self.rows)
