"""MatMulInt8Tiles' weights (runtimes/kernels/int8_tiles.cpp): MatMulNBits' 8-bit blocks laid out for the kernel."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtimes.kernels import DOMAIN, TILE_BLOCK, TILE_GROUP

GROUP, BLOCK = TILE_GROUP, TILE_BLOCK
QUADS = BLOCK // 4  # a block's k in quads of 4, one vpdpbusd lane each
OP = "MatMulInt8Tiles"


def tile_weights(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' 8-bit rows [N, blocks, 128] (+128, as pack_rows writes them) and scales [N, blocks] as the kernel
    reads them: [groups, blocks, 32, 64, 4] and [groups, blocks, 64], N padded to whole groups of 64 columns."""
    n, blocks, width = packed.shape
    if width != BLOCK or packed.dtype != np.uint8:
        raise ValueError(f"{OP} takes uint8 blocks of {BLOCK}, not {packed.dtype} blocks of {width}")
    groups = -(-n // GROUP)
    weights = np.full((groups * GROUP, blocks, BLOCK), 128, np.uint8)  # padding columns: zeros, never written out
    weights[:n] = packed
    scale = np.zeros((groups * GROUP, blocks), np.float32)
    scale[:n] = scales.reshape(n, blocks)
    tiles = weights.reshape(groups, GROUP, blocks, QUADS, 4).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(tiles), np.ascontiguousarray(scale.reshape(groups, GROUP, blocks).transpose(0, 2, 1))


def attributes(k: int, n: int) -> dict[str, Any]:
    """The node's attributes and domain, for onnx.helper.make_node(OP, ..., **attributes(k, n))."""
    return {"K": k, "N": n, "domain": DOMAIN}
