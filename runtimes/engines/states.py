"""Per-sequence recurrent state beside the KV cache, for grown-cache graphs whose layers keep one (state-space
layers, linear attention, short convolutions: builder/engine/generic/states.py writes them).

The graph takes each state as an input `state.{j}` [B, ...] and gives what it holds after the step as
`present_state.{j}`; every axis past the batch is fixed. A slot's state is one row of a buffer reserved at load,
[slots, ...]: a state does not grow with the sequence, so the KV pool does not count it. A sequence's first step
starts from zeros. A state cannot be taken back to an earlier position, so such an engine takes no speculation,
prefix reuse or chunk padding: a step's worked rows carry their tokens unpadded (step.pack's `equal`), and the
state of a row that ran only padding is not kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from runtimes.bundle import BundleError
from runtimes.engines.step import Work

STATE, PRESENT_STATE = "state.", "present_state."
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def state_name(j: int) -> str:
    return f"{STATE}{j}"


class States:
    """The graph's states, a buffer each, a row per slot."""

    def __init__(self, session: Any, slots: int) -> None:
        found = [i for i in session.get_inputs() if i.name.startswith(STATE)]
        self.names = [state_name(j) for j in range(len(found))]
        if sorted(i.name for i in found) != sorted(self.names):
            raise BundleError(f"the graph's states are {sorted(i.name for i in found)}; they must be numbered "
                              f"{STATE}0 on")
        by_name = {i.name: i for i in found}
        self.buffers: list[np.ndarray] = []
        for name in self.names:
            shape, kind = list(getattr(by_name[name], "shape", [])), by_name[name].type
            fixed = shape[1:]
            if not fixed or not all(isinstance(d, int) and d > 0 for d in fixed) or kind not in _DTYPES:
                raise BundleError(f"the graph's {name} is {kind} {shape}; a state has fixed sizes past its batch")
            self.buffers.append(np.zeros((slots, *fixed), _DTYPES[kind]))

    def __bool__(self) -> bool:
        return bool(self.buffers)

    @property
    def bytes_per_slot(self) -> int:
        return sum(b[0].nbytes for b in self.buffers)

    def feeds(self, rows: slice, held: np.ndarray) -> dict[str, np.ndarray]:
        """The rows' states; zeros for a row that holds no sequence yet (its first step)."""
        fresh = held == 0
        out = {}
        for name, buffer in zip(self.names, self.buffers, strict=True):
            part = buffer[rows]  # a view, read by the run; store() writes the rows after it
            if fresh.any():
                part = part.copy()
                part[fresh] = 0
            out[name] = part
        return out

    def store(self, rows: slice, works: Sequence[Work | None], width: int, presents: Sequence[np.ndarray]) -> None:
        """Keep each worked row's state after the step; a row with no work ran padding, which is dropped."""
        if not self.buffers:
            return
        for row, work in enumerate(works):
            if work is None:
                continue
            if len(work.tokens) != width:  # pack(equal=True) makes none: a bug, not a request's fault
                raise AssertionError(f"slot {work.slot} ran {len(work.tokens)} tokens padded to {width}")
            for buffer, present in zip(self.buffers, presents, strict=True):
                buffer[rows.start + row] = present[row]
