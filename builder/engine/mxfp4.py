"""MXFP4 expert weights (gpt-oss on the Hub) widened to fp32 rows, one expert at a time.

The OCP microscaling format: each row of K weights is cut into blocks of 32; a block is 16 bytes of 4-bit E2M1
codes (element 2j in the low nibble, 2j+1 in the high one) and one E8M0 byte, the block's power-of-two scale
2^(byte - 127). gpt-oss stores `{proj}_blocks` [E, N, K/32, 16] and `{proj}_scales` [E, N, K/32], rows N in
the nn.Linear orientation (output rows, input along K), which is what MoE's fc1 / fc2 want.
ONNX Runtime's QMoE has an MXFP4 mode (quant_type 'fp4'), but its CPU kernel reads the scales as fp32 and
fails (measured on 1.32), so the export widens the codes and writes the experts in the profile's own format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builder.errors import UnsupportedModel

if TYPE_CHECKING:  # checkpoint.py reads MXFP4 through dequant.py, which imports this module
    from builder.engine.checkpoint import Checkpoint

BLOCK = 32
# E2M1: sign, 2 exponent bits, 1 mantissa bit; codes 0-7 are +0 .. +6, 8-15 the same values negated
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
CODES = np.concatenate([E2M1, -E2M1])
BIAS = 127


def widen(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks [n, K/32, 16] uint8 and scales [n, K/32] uint8 -> fp32 rows [n, K]."""
    n, groups, _ = blocks.shape
    values = np.empty((n, groups, 2 * blocks.shape[2]), np.float32)
    values[..., 0::2] = CODES[blocks & 0x0F]
    values[..., 1::2] = CODES[blocks >> 4]
    # E8M0 is a bare biased exponent: the block is scaled by 2^(s - 127), which ldexp applies exactly
    np.ldexp(values, (scales.astype(np.int32) - BIAS)[..., None], out=values)
    return values.reshape(n, groups * 2 * blocks.shape[2])


def expert_rows(checkpoint: Checkpoint, prefix: str, expert: int, rows: int, k: int) -> np.ndarray:
    """Expert `expert`'s fp32 weight [rows, k] from `{prefix}_blocks` / `{prefix}_scales`, checked against the
    shapes the config implies."""
    blocks, scales = f"{prefix}_blocks", f"{prefix}_scales"
    groups = k // BLOCK
    for name, shape in ((blocks, (rows, groups, BLOCK // 2)), (scales, (rows, groups))):
        if k % BLOCK or checkpoint.shape(name)[1:] != shape:
            raise UnsupportedModel(f"MXFP4 tensor {name!r} is {list(checkpoint.shape(name))}; the config implies "
                                   f"[experts, {', '.join(map(str, shape))}]",
                                   hint="is config.json the one this checkpoint was saved with?")
    return widen(checkpoint.packed_rows(blocks, expert, expert + 1)[0],
                 checkpoint.packed_rows(scales, expert, expert + 1)[0])
