"""Whether a grown-cache trace (grown.py) holds for every length the engine runs it at: torch.export traces one
path through the model's code and keeps, as its program's shapes and ranges, what that path assumed of the
sequence axes. Code that branches on a length (a top-k over the keys once they outnumber a window) traces the
example's side of the branch and bounds the axis to it; code that needs two axes equal (an attention mask as long
as the input, from a model that takes the whole sequence each step) ties them into one symbol. Either graph
would load and then compute wrong tokens, or fail on a shape, past the lengths it was traced for: refused here,
with what the trace assumed, before the gate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def guarded_extremes() -> Iterator[None]:
    """While tracing: a max or min of lengths is the operand the example's lengths pick, under a guard that it
    wins, as Python's max would trace. torch.export's non-strict trace makes max(0, length - keys) (MPT's alibi
    slice) a symbolic Max instead, whose guards its solver misreads as inconsistent; a guard on the operands is
    one it solves, and one that does not hold for every length the engine runs narrows the traced ranges, which
    refusal() then says."""
    sym_max, sym_min = torch.sym_max, torch.sym_min

    def extreme(a: Any, b: Any, larger: bool) -> Any:
        if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
            return a if bool(a >= b) == larger else b
        return sym_max(a, b) if larger else sym_min(a, b)

    torch.sym_max = lambda a, b: extreme(a, b, True)  # type: ignore[assignment]
    torch.sym_min = lambda a, b: extreme(a, b, False)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.sym_max, torch.sym_min = sym_max, sym_min  # type: ignore[assignment]


def _bound(value: Any) -> float:
    try:
        return float(int(value))
    except (TypeError, ValueError, OverflowError):  # torch's int_oo (unbounded) and its negation
        return math.inf if value > 0 else -math.inf


def _axis(program: Any, name: str, dim: int) -> Any:
    """The exported program's size of an input's axis: a sympy symbol, an expression of several, or an int."""
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    size = node.meta["val"].shape[dim]
    return size.node.expr if isinstance(size, torch.SymInt) else int(size)


def refusal(program: Any, longest: int, one_token: bool = False) -> str | None:
    """Why the traced program (torch.export's ExportedProgram of grown.py's module) does not hold for new tokens
    and pasts of every length up to `longest`, each, with an attention mask as long as both; None where it does.
    one_token: the graph takes one new token a run, by design (a model with recurrent state: states.py)."""
    names = [spec.arg.name for spec in program.graph_signature.input_specs
             if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    new, mask = _axis(program, names[0], 1), _axis(program, names[1], 1)
    pasts = [_axis(program, name, 2) for name in names[4:] if name.startswith("past.")]  # not the states
    sized = (("attention mask's length", mask), *(("past's length", p) for p in pasts[:1]))
    for what, size in ((("new tokens", new),) if not one_token else ()) + sized:
        if isinstance(size, int):
            return (f"its modeling code fixes the {what} at {size} when traced (a size the graph cannot vary), "
                    "which the engine's steps do not keep")
    if mask == new or mask in pasts or new in pasts:
        return ("its modeling code needs its attention mask, new tokens and cache to line up in a way the engine's "
                "steps do not (it takes the whole sequence each step, not new tokens over its cache)")
    # where a trace assumed an axis is not 1, torch.export starts its range at 2 (its 0/1 specialization); the graph
    # still runs one new token (a decode step), which the gate's decode steps check
    for what, sizes, least, lowest in (("new tokens", [] if one_token else [new], 1, 2), ("past tokens", pasts, 0, 0)):
        for size in sizes:
            found = program.range_constraints.get(size)
            low, high = (_bound(found.lower), _bound(found.upper)) if found is not None else (-math.inf, math.inf)
            if low > lowest or high < longest:
                return (f"its modeling code branches on the sequence's length: the traced graph holds for "
                        f"{low:.0f} to {high:.0f} {what} only, not the {least} to {longest} the engine runs it at")
    return None
