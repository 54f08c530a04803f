"""Token-id prompts where n-gram prompt lookup can and cannot hit, on bench/lib/spec_model.py's model, whose greedy
continuation of any prompt is the chain f(last), f(f(last)), ... along its cycle.

  repeat  BOS, a chain t0, f(t0), ... of CHAIN tokens, then t0 again: the continuation repeats the prompt, so every
          lookup draft is right until the chain runs past the prompt's end
  editJ   the same with every J-th chain token replaced by a token off the chain: a draft that reaches a replaced
          token is wrong there, and the two tokens after a replaced one have no earlier bigram to look up
  open    BOS and distinct tokens none of which the continuation reaches: no n-gram repeats, so nothing is drafted

Every prompt is PROMPT_TOKENS long; `expected` is its greedy continuation. `lookup` replays the proposals a prompt
gets (mbuild's own propose() and its rule for k, up to DRAFTS, greedy acceptance): the acceptance mbuild drafting
whenever it finds a match would see, against which both servers' measured acceptance reads (llama.cpp drafts DRAFTS
every time it matches, so on edit prompts it reads lower).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from runtimes.generation.speculative import DEFAULT_DRAFTS, RowSpeculation, Speculation, propose

BOS = 1
CHAIN = 60  # chain tokens in a prompt, before the repeated t0
PROMPT_TOKENS = CHAIN + 2  # BOS, the chain, t0 again (open: BOS and CHAIN + 1 tokens)
NEW_TOKENS = 64
DRAFTS = DEFAULT_DRAFTS["ngram"]  # lookup's drafts a verify row at most: mbuild's default, given to llama.cpp too
# both servers' n-gram sizes looked up: mbuild's defaults
LOOKUP_MIN, LOOKUP_MAX = Speculation.prompt_lookup_min, Speculation.prompt_lookup_max
Proposer = Callable[[list[int], int], tuple[int, ...]]  # (the sequence, k) -> up to k drafts
FAR = 200  # replacement and open-prompt tokens lie at least this far along the cycle from the chain


@dataclass(frozen=True)
class Kind:
    key: str
    every: int | None = None  # edit: every `every`-th chain token replaced
    lookup_hits: bool = True  # False: the prompt repeats no n-gram

    @property
    def title(self) -> str:
        if self.key == "repeat":
            return f"repeat: a {CHAIN}-token chain, then its first token again"
        if self.every is not None:
            return f"edit, every {self.every}{_nth(self.every)} chain token replaced"
        return "open: distinct tokens, nothing repeats"


def _nth(number: int) -> str:
    return {1: "st", 2: "nd", 3: "rd"}.get(number if number < 20 else number % 10, "th")


def kinds(edits: tuple[int, ...]) -> tuple[Kind, ...]:
    return (Kind("repeat"), *(Kind(f"edit{j}", j) for j in edits), Kind("open", lookup_hits=False))


def _along(order: np.ndarray, start: int, count: int) -> list[int]:
    return [int(t) for t in order[(start + np.arange(count)) % order.size]]


def _far(order: np.ndarray, start: int, count: int, rng: np.random.Generator) -> list[int]:
    """`count` distinct tokens of the cycle at least FAR steps from `start` either way."""
    steps = rng.choice(order.size - 2 * FAR, size=count, replace=False) + FAR
    return [int(order[(start + int(step)) % order.size]) for step in steps]


def prompt(kind: Kind, order: np.ndarray, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(prompt ids, expected greedy continuation of NEW_TOKENS ids) of `kind`, drawn with `rng`."""
    start = int(rng.integers(order.size))
    if kind.key == "open":  # the last token's continuation runs from start + 1; the others lie far from it
        return [BOS, *_far(order, start, CHAIN, rng), int(order[start])], _along(order, start + 1, NEW_TOKENS)
    chain = _along(order, start, CHAIN)
    if kind.every is not None:
        spots = range(kind.every - 1, CHAIN, kind.every)
        for spot, token in zip(spots, _far(order, start, len(spots), rng), strict=True):
            chain[spot] = token
    return [BOS, *chain, int(order[start])], _along(order, start + 1, NEW_TOKENS)


def prompts(kind: Kind, order: np.ndarray, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    return [prompt(kind, order, rng) for _ in range(count)]


def lookup(ids: list[int], expected: list[int], drafts: int = DRAFTS) -> dict[str, int]:
    """Replay greedy decoding of `expected` after `ids` with prompt lookup drafting up to `drafts` tokens a step, k
    following mbuild's rule (RowSpeculation), fewer where fewer remain: verify steps, drafted and accepted tokens."""
    return replay(ids, expected, looked_up, drafts, adaptive=True)


def looked_up(sequence: list[int], k: int) -> tuple[int, ...]:
    """Prompt lookup's drafts at the benchmark's sizes (mbuild's own propose())."""
    return propose(sequence, k, LOOKUP_MIN, LOOKUP_MAX)


def chained(successor: np.ndarray) -> Proposer:
    """A draft model's proposals, replayed: its successor function chained from the sequence's last token."""
    def proposer(sequence: list[int], k: int) -> tuple[int, ...]:
        made = [sequence[-1]]
        for _ in range(k):
            made.append(int(successor[made[-1]]))
        return tuple(made[1:])
    return proposer


def replay(ids: list[int], expected: list[int], proposer: Proposer, drafts: int,
           adaptive: bool = False) -> dict[str, int]:
    """Greedy decoding of `expected` after `ids`, `proposer` drafting up to `drafts` tokens a step (adaptive: as many
    as mbuild's lookup rule allows, else always `drafts`)."""
    steps = drafted = accepted = 0
    for proposed, right in walk(ids, expected, proposer, drafts, adaptive):
        if proposed:
            steps, drafted, accepted = steps + 1, drafted + proposed, accepted + right
    return {"verify_steps": steps, "drafted": drafted, "accepted": accepted}


def widths(ids: list[int], expected: list[int]) -> list[int]:
    """The tokens each step of lookup's replay runs: 1 for a plain decode, 1 + drafts for a verify row."""
    return [1 + proposed for proposed, _ in walk(ids, expected, looked_up, DRAFTS, True)]


def walk(ids: list[int], expected: list[int], proposer: Proposer, drafts: int,
         adaptive: bool) -> list[tuple[int, int]]:
    """Per step of greedy decoding `expected` after `ids`: (drafts proposed, drafts right)."""
    sequence, made, found = list(ids), 0, []
    row = RowSpeculation(drafts)
    while made < len(expected):
        proposal = proposer(sequence, min(row.k if adaptive else drafts, len(expected) - made - 1))
        right = next((i for i, token in enumerate(proposal) if token != expected[made + i]), len(proposal))
        if adaptive and proposal:
            row.record(len(proposal), right, drafts, lookup=True)
        found.append((len(proposal), right))
        sequence += expected[made:made + right + 1]
        made += right + 1
    return found
