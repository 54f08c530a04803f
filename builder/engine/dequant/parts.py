"""What the format readers share: the stored tensors they read, the views they make, small tensors read whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Stored(Protocol):
    """What a view reads: the checkpoint's stored tensors (checkpoint.Checkpoint)."""

    def __contains__(self, name: str) -> bool: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def dtype(self, name: str) -> str: ...
    def rows(self, name: str, r0: int, r1: int) -> np.ndarray: ...
    def packed_rows(self, name: str, r0: int, r1: int) -> np.ndarray: ...


# An integer format's rows [r0, r1) as stored: unsigned codes [n, K], zero points [n, G] in the same space (or one
# for all: a symmetric scheme's) and scales [n, G]; a value is (code - zero) * scale
Coded = tuple[np.ndarray, "np.ndarray | int", np.ndarray]


@dataclass(frozen=True)
class Grid:
    """An integer weight whose groups are runs of `group` input columns once the columns are taken in `order`
    (None: as stored; GPTQ's act-order: by group): what MatMulNBits' blocks are, so a build at the same bits and
    block size keeps the codes (weight_writer.py) rather than rounding again."""

    bits: int
    group: int
    coded: Callable[[int, int], Coded]
    order: np.ndarray | None = None


@dataclass(frozen=True)
class View:
    """A weight decoded from stored tensors: its shape and rows [r0, r1) in fp32."""

    shape: tuple[int, ...]
    read: Callable[[int, int], np.ndarray]
    parts: tuple[str, ...]  # the stored tensors it is made of
    grid: Grid | None = None  # its codes, where they can be kept

    def rows(self, r0: int, r1: int) -> np.ndarray:
        return self.read(r0, r1)


def whole(stored: Stored, name: str) -> np.ndarray:
    """A small tensor (scales, zeros) whole in fp32; a 0-d one as [1]. E8M0 scales (DeepSeek-V3.2's UE8M0, MX's)
    are bare biased exponents, 2^(byte - 127)."""
    shape = stored.shape(name)
    if stored.dtype(name) == "F8_E8M0":
        return np.ldexp(np.float32(1.0), ints(stored, name, 0, shape[0] if shape else 1).astype(np.int32) - 127)
    return stored.rows(name, 0, shape[0]) if shape else stored.rows(name, 0, 1).reshape(1)


def ints(stored: Stored, name: str, r0: int, r1: int) -> np.ndarray:
    """Rows of an integer tensor as stored (I32 words, I8 values)."""
    return stored.packed_rows(name, r0, r1) if stored.shape(name) else stored.packed_rows(name, 0, 1).reshape(1)
