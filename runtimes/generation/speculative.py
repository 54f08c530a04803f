"""Speculative decoding's proposals and the decision to make them: n-gram lookup in a sequence's own tokens (here),
or a draft model's greedy tokens (draft.py).

Prompt lookup (vLLM's `ngram` method, llama.cpp's `--spec-type ngram-*`): the longest suffix of the sequence,
prompt_lookup_max tokens down to prompt_lookup_min, that occurred before, and the tokens that followed its latest
earlier occurrence, as drafts. A verify row runs the last token and the drafts in one step; the target's logits at
each position are sampled exactly as without speculation (sampling.next_token), and a draft is accepted while the
sample equals it. For a proposal that is one fixed token (q = 1 at the draft), that is the standard rejection rule:
accepted with probability p(draft), else a sample from p without the draft, renormalized; so the output's
distribution is unchanged, and with a seed, so is every token, since each emitted token costs one draw either way.

Whether a row speculates is a cost decision (`choose`): a verify row of k drafts is expected to give
E = (1 - a^(k+1)) / (1 - a) tokens at the row's measured per-draft acceptance a (the chance a draft is right once
the ones before it were: accepted drafts over accepted drafts and first rejections, not over all drafted, which
counts the drafts past a rejection that were never tried as wrong), and may cost one more run (engine
step.py: a verify row runs alone on ONNX Runtime's CPU attention); a draft model's k drafts cost k of its steps
(shared by every row it drafts for), each priced at load against a target step. A row speculates when the step's
expected tokens per unit of cost rise. k follows acceptance: one more after a fully accepted row, one fewer after a
rejected first draft, between 1 and num_speculative_tokens; but a lookup row with a wrong draft next drafts one past
the run it got right (copied text goes wrong where it diverges, and a run's length tends to repeat). A lookup row
that decodes plainly while its batch could still pay for a verify row learns from the first draft it watches each
step (watch, check), so one that began in a fuller batch speculates once its drafts have shown they would pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runtimes.engines.step import PASS_TOKENS
from runtimes.settings import Settings

# The most drafts a verify row carries when the server is not told (vLLM asks for num_speculative_tokens; these are
# mbuild's): lookup's drafts cost nothing to make and a row's k follows its accepted runs, so a long match may run long;
# a draft model's each cost a draft step, and best_k picks fewer than this as acceptance falls.
DEFAULT_DRAFTS = {"ngram": 8, "draft": 4}
PRIOR_ACCEPTANCE = 0.5  # before a row has verified anything; a row's own measurements replace it
PRIOR_TRIES = 2.0  # the prior's weight, in drafts tried
MEMORY = 0.7  # weight of the past (per verify row or watched draft) in a row's running acceptance
RECOVERY = 0.02  # per step a row does not speculate, its acceptance drifts back to the prior: it probes again


@dataclass(frozen=True)
class Speculation:
    """The server's speculative decoding (vLLM's names): method "ngram", "draft" (the bundle's draft model) or
    "off"."""

    method: str = "off"
    num_speculative_tokens: int | None = None  # None: the method's DEFAULT_DRAFTS
    prompt_lookup_min: int = Settings.prompt_lookup_min
    prompt_lookup_max: int = Settings.prompt_lookup_max

    @property
    def on(self) -> bool:
        return self.method != "off"

    @property
    def most(self) -> int:
        """The most drafts a verify row carries."""
        return self.num_speculative_tokens or DEFAULT_DRAFTS.get(self.method, 1)


@dataclass
class RowSpeculation:
    """A sequence's acceptance so far, and the drafts it proposes next."""

    k: int
    acceptance: float = PRIOR_ACCEPTANCE
    drafts: int = 0  # verify rows run
    drafted: int = 0  # draft tokens run
    accepted: int = 0  # draft tokens accepted
    shadow: int | None = None  # lookup's first draft for a step the row decoded plainly, to check against its token
    shadow_from: int = 0  # the tokens it had generated when it was found
    right: float = field(default=0.0, init=False)  # drafts accepted and tried (accepted ones and first rejections),
    tried: float = field(default=0.0, init=False)  # decayed by MEMORY: acceptance is their ratio, from the prior's

    def __post_init__(self) -> None:
        self.right, self.tried = self.acceptance * PRIOR_TRIES, PRIOR_TRIES

    def record(self, drafted: int, accepted: int, ceiling: int, lookup: bool = False) -> None:
        """A verify row's outcome."""
        self.drafts, self.drafted, self.accepted = self.drafts + 1, self.drafted + drafted, self.accepted + accepted
        self.learn(drafted, accepted, ceiling, lookup)

    def watch(self, draft: int, generated: int) -> None:
        """Lookup's first draft for a step in which this row decodes plainly: it costs nothing to find, and the token
        the row makes tells whether it was right, one draft a step (without this a row that began in a batch too
        full to speculate would keep the prior, and never speculate as the batch thinned)."""
        self.shadow, self.shadow_from = draft, generated

    def check(self, generated: Sequence[int], ceiling: int) -> None:
        """Learn from the watched draft once the row has made the token it stood for, as from a one-draft verify row
        (acceptance, and k: one more if right, one if wrong)."""
        if self.shadow is not None and len(generated) > self.shadow_from:
            self.learn(1, int(generated[self.shadow_from] == self.shadow), ceiling, lookup=True)
            self.shadow = None

    def learn(self, drafted: int, accepted: int, ceiling: int, lookup: bool) -> None:
        """Acceptance and k from drafts and how many were right. lookup: the drafts were copied (n-gram), so a row
        with a wrong draft sets k to its right run plus one; a draft model's errors fall anywhere: its k holds, or
        falls by one if none was right."""
        self.right = MEMORY * self.right + accepted
        self.tried = MEMORY * self.tried + accepted + (accepted < drafted)  # the drafts past a rejection: not tried
        self.acceptance = self.right / self.tried
        if accepted == drafted:
            self.k = min(ceiling, self.k + 1)
        elif lookup:
            self.k = min(ceiling, accepted + 1)
        elif not accepted:
            self.k = max(1, self.k - 1)

    def skipped(self) -> None:
        self.right += RECOVERY * (PRIOR_ACCEPTANCE * self.tried - self.right)
        self.acceptance = self.right / self.tried

    def expected_tokens(self, k: int) -> float:
        a = min(self.acceptance, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)


def propose(tokens: Sequence[int], k: int, shortest: int, longest: int) -> tuple[int, ...]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `tokens` (longest down to
    shortest tokens); none when no suffix occurred before."""
    n_tokens = len(tokens)
    for size in range(min(longest, n_tokens - 1), shortest - 1, -1):
        suffix = list(tokens[n_tokens - size:])
        for start in range(n_tokens - size - 1, -1, -1):  # latest first; the suffix itself is not a match
            if tokens[start] == suffix[0] and list(tokens[start:start + size]) == suffix:
                follow = tokens[start + size:start + size + k]
                if follow:
                    return tuple(follow)
    return ()


def run_cost(rows: int, width: int) -> float:
    """One run's cost in passes over the weights: the pass, and its padded tokens' compute (step.PASS_TOKENS)."""
    return 1 + rows * width / PASS_TOKENS


def best_k(spec: RowSpeculation, most: int, draft_pass: float) -> int:
    """The drafts (1..most) a draft model should make for a row: the most expected tokens per unit of cost, alone
    (each draft costs a draft step, so at middling acceptance fewer are cheaper per token)."""
    return max(range(1, most + 1), key=lambda k: spec.expected_tokens(k) / (run_cost(1, 1 + k) + draft_pass * k))


def may_pay(most: int, rows: int) -> bool:
    """Whether a lookup row of up to `most` drafts could speculate among `rows` decoding rows at any acceptance:
    choose() stops at its first candidate unless that one pays, and a shorter verify row may pay where a longer one
    does not, so every k up to most is tried. False lets a full batch skip its lookups (tens of microseconds of
    Python a row, about 1% of a 16-row step here), and their watches: no row would speculate, however well its
    drafts did."""
    spec = RowSpeculation(k=most, acceptance=1.0)
    return any(choose([(spec.expected_tokens(k), k)], rows - 1) for k in range(1, most + 1))


def choose(candidates: Sequence[tuple[float, int]], plain: int, draft_pass: float = 0.0) -> set[int]:
    """Which candidates (expected tokens, drafts k) speculate beside `plain` rows that cannot: greedily, by expected
    tokens, each while the step's expected tokens per unit of cost rise. The rest decode in one run. draft_pass: a
    draft step's cost in target passes (0 for n-gram lookup); the chosen rows share max(k) draft steps."""
    decoding = plain + len(candidates)  # every row starts as a plain decode row

    def cost(rows: int, verify: float, steps: int) -> float:
        return (run_cost(rows, 1) if rows else 0.0) + verify + draft_pass * steps

    tokens, verify, steps, chosen = float(decoding), 0.0, 0, set()
    for index in sorted(range(len(candidates)), key=lambda i: -candidates[i][0]):
        expected, k = candidates[index]
        more, more_verify, more_steps = tokens - 1 + expected, verify + run_cost(1, 1 + k), max(steps, k)
        if more / cost(decoding - 1, more_verify, more_steps) <= tokens / cost(decoding, verify, steps):
            break
        chosen.add(index)
        tokens, verify, steps, decoding = more, more_verify, more_steps, decoding - 1
    return chosen
