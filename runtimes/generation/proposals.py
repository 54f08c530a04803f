"""Which decode rows of a step speculate, and their drafts (the cost rule is speculative.choose's).

Lookup's drafts are free to find, so they are found first and weighed as found; where the batch is too full for any
verify row to pay (speculative.may_pay) none is looked up. A lookup row that decodes plainly watches the first draft
it was not given (RowSpeculation.watch), so its acceptance is known by the time the batch thins. A draft model's
drafts cost k of its steps, so its rows are chosen first, on k (best_k), and only the chosen ones are drafted.
"""

from __future__ import annotations

from runtimes.generation.draft import DraftModel
from runtimes.generation.rows import Row
from runtimes.generation.speculative import RowSpeculation, Speculation, best_k, choose, may_pay, propose

Hopeful = tuple[Row, RowSpeculation, int]  # a row that may speculate, its speculation, the most drafts it may take


def proposals(hopeful: list[Hopeful], decoding: int, speculation: Speculation,
              draft: DraftModel | None) -> dict[int, tuple[int, ...]]:
    """Per chosen slot its drafts, among `decoding` decode rows (the hopeful ones and those that cannot speculate).
    A hopeful row not chosen counts a step skipped, or, given lookup drafts, watches the first."""
    if draft is None:
        return _lookups(hopeful, decoding, speculation)
    wants = [best_k(spec, most, draft.pass_cost) for _, spec, most in hopeful]
    picked = choose([(spec.expected_tokens(k), k) for (_, spec, _), k in zip(hopeful, wants, strict=True)],
                    decoding - len(hopeful), draft.pass_cost)
    for index, (_, spec, _) in enumerate(hopeful):
        if index not in picked:
            spec.skipped()
    made = draft.propose({hopeful[i][0].slot: (hopeful[i][0].tokens, wants[i]) for i in picked})
    return {slot: drafts for slot, drafts in made.items() if drafts}


def _lookups(hopeful: list[Hopeful], decoding: int, s: Speculation) -> dict[int, tuple[int, ...]]:
    if hopeful and not may_pay(max(most for *_, most in hopeful), decoding):
        for _, spec, _ in hopeful:
            spec.skipped()
        return {}
    found = [(row, spec, drafts) for row, spec, most in hopeful
             if (drafts := propose(row.tokens, most, s.prompt_lookup_min, s.prompt_lookup_max))]
    picked = choose([(spec.expected_tokens(len(drafts)), len(drafts)) for _, spec, drafts in found],
                    decoding - len(found))
    for index, (row, spec, drafts) in enumerate(found):
        if index not in picked:  # it measures what it would have got instead of drifting back to the prior
            spec.watch(drafts[0], len(row.sampler.generated))
    return {found[i][0].slot: found[i][2] for i in picked}
