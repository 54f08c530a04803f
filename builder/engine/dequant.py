"""A pre-quantized checkpoint's weights read back to fp32, a block of rows at a time (checkpoint.py asks).

Each format of builder/model/quantization.py becomes views: a weight by the name the model's module has (its
`.weight`, or gpt-oss's fused `gate_up_proj`), with the shape the module holds it in, whose rows are decoded from
the stored tensors when asked. So the export, the gate's reference and the plan read the same weights, and build
memory follows the block asked for: a GPTQ or AWQ weight's columns are read from its packed rows band by band.

Every format is one of two grids:
- floating: FP8 codes (ml_dtypes decodes E4M3/E5M2) times a scale per block of [rows, columns]; DeepSeek's
  128x128 `weight_scale_inv`, a channel's or the tensor's `weight_scale` are blocks of other sizes; MXFP4
  (mxfp4.py) is E2M1 codes with a power-of-two scale per 32;
- integer: (q - zero) * scale, the group of a column from g_idx (GPTQ's act-order) or its index over the group
  size, q and zero unpacked from int32 words: GPTQ packs q along the input, zeros along the output; AWQ both along
  the output in its interleaved order; compressed-tensors along the input, offset to unsigned.
transformers dequantizes only some of these (FP8, MXFP4), and a whole tensor at once; so the reading is here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import ml_dtypes
import numpy as np

from builder.engine import mxfp4
from builder.errors import UnsupportedModel
from builder.model.quantization import AWQ, FP8, GPTQ, MXFP4, SourceFormat

FLOAT8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # word nibble j holds column AWQ_ORDER[j] of its 8
COLUMN_CHUNK = 16 << 20  # bytes of packed rows read at once when a band of columns is cut from them


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


def views(stored: Stored, names: list[str], fmt: SourceFormat) -> dict[str, View]:
    """Every quantized weight of the checkpoint, by the module's name for it."""
    found: dict[str, View] = {}
    for name in names:
        made = _view(stored, name, fmt)
        if made is not None:
            found[made[0]] = made[1]
    return found


def _view(stored: Stored, name: str, fmt: SourceFormat) -> tuple[str, View] | None:
    stem, _, leaf = name.rpartition(".")
    if fmt.method == MXFP4 and name.endswith("_blocks") and f"{name[:-7]}_scales" in stored:
        return name[:-7], _mxfp4(stored, name[:-7])
    if stored.dtype(name) in FLOAT8:
        scale = next((f"{name}{s}" for s in ("_scale_inv", "_scale") if f"{name}{s}" in stored), None)
        return name, _float8(stored, name, scale)
    if leaf == "qweight" and fmt.method in (GPTQ, AWQ):
        return f"{stem}.weight", (_gptq if fmt.method == GPTQ else _awq)(stored, stem, fmt)
    if leaf == "weight_packed":
        return f"{stem}.weight", _packed(stored, stem, fmt)
    if leaf == "weight" and stored.dtype(name) == "I8" and f"{name}_scale" in stored:  # int-quantized
        return name, _integer(stored, stem, fmt)
    return None


def _mxfp4(stored: Stored, name: str) -> View:
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


def _float8(stored: Stored, name: str, scale: str | None) -> View:
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
        spread = _whole(stored, scale) if scale is not None else None
        if len(shape) == 2:
            return matrix(codes, spread, r0, r1)
        return np.stack([matrix(codes[e - r0], expert(spread, e), 0, rows) for e in range(r0, r1)])
    return View(tuple(shape), read, (name, *([scale] if scale else [])))


def _whole(stored: Stored, name: str) -> np.ndarray:
    """A small tensor (scales, zeros) whole in fp32; a 0-d one as [1]. E8M0 scales (DeepSeek-V3.2's UE8M0, MX's)
    are bare biased exponents, 2^(byte - 127)."""
    shape = stored.shape(name)
    if stored.dtype(name) == "F8_E8M0":
        return np.ldexp(np.float32(1.0), _ints(stored, name, 0, shape[0] if shape else 1).astype(np.int32) - 127)
    return stored.rows(name, 0, shape[0]) if shape else stored.rows(name, 0, 1).reshape(1)


def _ints(stored: Stored, name: str, r0: int, r1: int) -> np.ndarray:
    """Rows of an integer tensor as stored (I32 words, I8 values)."""
    return stored.packed_rows(name, r0, r1) if stored.shape(name) else stored.packed_rows(name, 0, 1).reshape(1)


def unpack(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words -> their 32/bits unsigned values each, lowest bits first, along `axis`."""
    if 32 % bits:
        raise UnsupportedModel(f"{bits}-bit weights pack across int32 words; mbuild reads 2, 4 and 8 bits")
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    moved = np.moveaxis(words.view(np.uint32), axis, -1)
    values = (moved[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return np.moveaxis(values.reshape(*moved.shape[:-1], -1).astype(np.int32), -1, axis)


def _columns(stored: Stored, name: str, c0: int, c1: int) -> np.ndarray:
    """Columns c0..c1 of a stored integer tensor, read a chunk of rows at a time."""
    rows, cols = stored.shape(name)
    step = max(1, COLUMN_CHUNK // (4 * cols))
    return np.concatenate([stored.packed_rows(name, r, min(r + step, rows))[:, c0:c1] for r in range(0, rows, step)])


def _grid(q: np.ndarray, zeros: np.ndarray | float, scales: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(q - zero) * scale for q [n, K], zeros and scales [n, G], groups [K] each column's group."""
    zero = zeros[:, groups] if isinstance(zeros, np.ndarray) else zeros
    return ((q - zero) * scales[:, groups]).astype(np.float32)


def _integer_view(shape: tuple[int, int], coded: Callable[[int, int], Coded], groups: np.ndarray, fmt: SourceFormat,
                  parts: tuple[str, ...]) -> View:
    """A weight of codes, zeros and scales: decoded to fp32 by its groups, and kept as a Grid where its groups are
    runs of the format's group size (a whole row: per channel), as stored or once its columns are sorted by group
    (act-order: each group still `group` columns)."""
    group = fmt.group or shape[1]
    runs = np.arange(shape[1]) // group
    order = np.argsort(groups, kind="stable")
    kept = Grid(fmt.bits, group, coded, None if np.array_equal(order, np.arange(shape[1])) else order)
    return View(shape, lambda r0, r1: _grid(*coded(r0, r1), groups), parts,
                kept if np.array_equal(groups[order], runs) else None)


def _group_of(stored: Stored, stem: str, k: int, group: int, count: int) -> np.ndarray:
    """Each input column's group: GPTQ's g_idx where stored (act-order permutes it), else its index over the
    group size."""
    if f"{stem}.g_idx" in stored:
        found = _ints(stored, f"{stem}.g_idx", 0, k).astype(np.int64)
        if found.shape != (k,) or found.min(initial=0) < 0 or found.max(initial=0) >= count:
            raise UnsupportedModel(f"{stem}.g_idx does not map {k} columns onto {count} groups",
                                   hint="is the checkpoint intact?")
        return found
    return np.minimum(np.arange(k) // (group if group > 0 else k), count - 1)


def _gptq(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """qweight [K*b/32, N] packed along the input; qzeros [G, N*b/32] along the output; scales [G, N]."""
    words, n = stored.shape(f"{stem}.qweight")
    k, count = words * 32 // fmt.bits, stored.shape(f"{stem}.scales")[0]

    def coded(r0: int, r1: int) -> Coded:
        q = unpack(_columns(stored, f"{stem}.qweight", r0, r1), fmt.bits, 0).T
        zeros = unpack(_ints(stored, f"{stem}.qzeros", 0, count), fmt.bits, 1)[:, r0:r1].T + fmt.zero_offset
        return q, zeros, _whole(stored, f"{stem}.scales")[:, r0:r1].T
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("qweight", "qzeros", "scales", "g_idx")))


def _awq_unpack(words: np.ndarray) -> np.ndarray:
    """AWQ's int32 words [.., W] -> [.., 8W] columns in order (nibble j holds column AWQ_ORDER[j])."""
    values = unpack(words, 4, words.ndim - 1)
    shaped = values.reshape(*values.shape[:-1], -1, 8)
    ordered = np.empty_like(shaped)
    ordered[..., AWQ_ORDER] = shaped
    return ordered.reshape(values.shape)


def _awq(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """qweight [K, N/8] and qzeros [K/g, N/8] packed along the output; scales [K/g, N]; x @ W."""
    k, words = stored.shape(f"{stem}.qweight")
    n, count = words * 8, stored.shape(f"{stem}.scales")[0]

    def coded(r0: int, r1: int) -> Coded:
        w0 = r0 // 8
        cut = slice(r0 - 8 * w0, r1 - 8 * w0)
        q = _awq_unpack(_columns(stored, f"{stem}.qweight", w0, -(-r1 // 8)))[:, cut].T
        zeros = _awq_unpack(_ints(stored, f"{stem}.qzeros", 0, count))[:, r0:r1].T
        return q, zeros, _whole(stored, f"{stem}.scales")[:, r0:r1].T
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("qweight", "qzeros", "scales")))


def _packed(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """compressed-tensors' pack-quantized: weight_packed [N, K*b/32] along the input, signed values stored offset
    by 2^(b-1); weight_scale [N, G]; an asymmetric scheme's weight_zero_point packed along the output, offset alike
    (so codes and zeros are compared unsigned)."""
    n, words = stored.shape(f"{stem}.weight_packed")
    k = words * 32 // fmt.bits
    if f"{stem}.weight_shape" in stored:
        k = int(_ints(stored, f"{stem}.weight_shape", 0, 2)[1])
    count = _whole(stored, f"{stem}.weight_scale").reshape(n, -1).shape[1]
    zero_name = f"{stem}.weight_zero_point"

    def coded(r0: int, r1: int) -> Coded:
        q = unpack(stored.packed_rows(f"{stem}.weight_packed", r0, r1), fmt.bits, 1)[:, :k]
        zeros = (unpack(_ints(stored, zero_name, 0, stored.shape(zero_name)[0]), fmt.bits, 0)[r0:r1]
                 if zero_name in stored else 1 << (fmt.bits - 1))
        return q, zeros, _whole(stored, f"{stem}.weight_scale").reshape(n, -1)[r0:r1]
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("weight_packed", "weight_scale", "weight_zero_point")))


def _integer(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """compressed-tensors' int-quantized: weight I8 [N, K], weight_scale [N, G] (or one), weight_zero_point."""
    n, k = stored.shape(f"{stem}.weight")
    scale = _whole(stored, f"{stem}.weight_scale")
    count = scale.reshape(n, -1).shape[1] if scale.size > 1 else 1
    groups = _group_of(stored, stem, k, fmt.group, count)
    zero_name = f"{stem}.weight_zero_point"

    def read(r0: int, r1: int) -> np.ndarray:
        q = stored.packed_rows(f"{stem}.weight", r0, r1).astype(np.int32)
        spread = np.broadcast_to(scale.reshape(-1, count), (n, count))[r0:r1]
        zeros = (np.broadcast_to(_ints(stored, zero_name, 0, (stored.shape(zero_name) or (1,))[0])
                                 .reshape(-1, count), (n, count))[r0:r1] if zero_name in stored else 0.0)
        return _grid(q, zeros, spread, groups)
    return View((n, k), read, (f"{stem}.weight", f"{stem}.weight_scale", zero_name))


__all__ = ["FP8", "View", "unpack", "views"]
