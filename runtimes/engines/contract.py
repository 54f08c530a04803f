"""The one contract between the scheduler and a decoder engine: slots of KV cache, stepped together.

The scheduler (runtimes/generation/), its KV pool, prefix cache and draft model all take a SlotEngine; the real one
is runtimes/engines/decoder.py's DecoderEngine, and the tests' fakes (tests/support/scheduler_fakes.py,
scripted_model.py) are checked against this Protocol by mypy and by tests/unit/runtimes/engines/test_engine_contract.py.
Per-row inputs the engine may take later (a LoRA adapter, input embeddings) travel in each Work (step.py);
recurrent state lives in the engine, per slot: `truncate` and `keep` refuse what it cannot take back, and a slot
starts from zeros after `release`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from runtimes.engines.step import StepOutput, Work


class SlotEngine(Protocol):
    @property
    def lengths(self) -> np.ndarray:
        """Per slot, the positions its sequence holds."""
        ...

    @property
    def written(self) -> np.ndarray:
        """Per slot, the positions its pages reach (padding too): what the KV pool counts as memory."""
        ...

    @property
    def bytes_per_token(self) -> int: ...

    def step(self, works: Sequence[Work]) -> StepOutput:
        """Append each work's tokens to its slot, all in one step."""
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` positions (a verify row's rejected drafts go)."""
        ...

    def release(self, row: int) -> None:
        """The slot is free; its positions stay until `forget` or the next sequence's `keep`."""
        ...

    def forget(self, slot: int, keep: int) -> None:
        """Hand back the memory of the slot's positions from `keep` on."""
        ...

    def read(self, row: int, count: int) -> list[np.ndarray]:
        """A copy of a slot's first `count` positions, a block per cache buffer."""
        ...

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None:
        """Fill a slot's first `count` positions from `read`'s blocks."""
        ...

    def copy(self, source: int, row: int, count: int) -> None:
        """Fill a slot's first `count` positions from another slot's."""
        ...

    def keep(self, row: int, count: int) -> None:
        """The slot's next sequence holds its first `count` positions as they are."""
        ...
