"""The floating grids: FP8 codes times a scale per block, gpt-oss's MXFP4 (mxfp4.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from builder.engine import mxfp4
from builder.engine.dequant.parts import Stored, View, whole
from builder.errors import UnsupportedModel

FLOAT8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


def mxfp4_view(stored: Stored, name: str) -> View:
    """gpt-oss's experts: blocks [E, N, K/32, 16] decoded to the module's [E, K, N] (x @ W), an expert a row."""
    experts, n, groups, _ = stored.shape(f"{name}_blocks")
    k = groups * mxfp4.BLOCK

    def read(r0: int, r1: int) -> np.ndarray:
        return np.stack([mxfp4.widen(stored.packed_rows(f"{name}_blocks", e, e + 1)[0],
                                     stored.packed_rows(f"{name}_scales", e, e + 1)[0]).T for e in range(r0, r1)])
    return View((experts, k, n), read, (f"{name}_blocks", f"{name}_scales"))


def _blocks(scale: np.ndarray, rows: int, cols: int, r0: int, r1: int) -> np.ndarray:
    """A scale of shape [sR, sC] (a block per [rows/sR, cols/sC] of the weight) spread over rows r0..r1."""
    scale = scale.reshape((1, 1) if scale.size == 1 else (scale.shape[0], -1))
    per_row, per_col = -(-rows // scale.shape[0]), -(-cols // scale.shape[1])
    band = scale[r0 // per_row: (r1 - 1) // per_row + 1]
    spread = np.repeat(np.repeat(band, per_row, 0), per_col, 1)
    return spread[r0 - (r0 // per_row) * per_row:][: r1 - r0, :cols]


def float8_view(stored: Stored, name: str, scale: str | None) -> View:
    """FP8 codes times their scale's blocks: a matrix [N, K] with a scale of [sN, sK] (one, a channel's, DeepSeek's
    128x128 blocks), or experts stacked [E, N, K] with one such scale each ([E, sN, sK]), an expert a row."""
    shape = stored.shape(name)
    if len(shape) not in (2, 3):
        raise UnsupportedModel(f"FP8 tensor {name!r} is {list(shape)}; mbuild reads FP8 matrices and stacks of them",
                               hint="is the checkpoint intact?")
    kind = FLOAT8[stored.dtype(name)]
    rows, cols = shape[-2:]

    def matrix(values: np.ndarray, spread: np.ndarray | None, r0: int, r1: int) -> np.ndarray:
        decoded = values.view(kind).astype(np.float32)
        if spread is not None:
            decoded *= _blocks(spread, rows, cols, r0, r1)
        return decoded

    def expert(spread: np.ndarray | None, e: int) -> np.ndarray | None:
        """Expert e's scale: [sN, sK] of [E, sN, sK], or one of a scale (or a channel's) per expert."""
        if spread is None or spread.size == 1:
            return spread
        return spread[e] if spread.ndim == 3 else spread.reshape(shape[0], -1)[e]

    def read(r0: int, r1: int) -> np.ndarray:
        codes = stored.packed_rows(name, r0, r1)
        spread = whole(stored, scale) if scale is not None else None
        if len(shape) == 2:
            return matrix(codes, spread, r0, r1)
        return np.stack([matrix(codes[e - r0], expert(spread, e), 0, rows) for e in range(r0, r1)])
    return View(tuple(shape), read, (name, *([scale] if scale else [])))
