"""The integer grids: (q - zero) * scale, q and zeros unpacked from int32 words (GPTQ, AWQ, compressed-tensors)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from builder.engine.dequant.parts import Coded, Grid, Stored, View, ints, whole
from builder.errors import UnsupportedModel
from builder.model.quantization import SourceFormat

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # word nibble j holds column AWQ_ORDER[j] of its 8
COLUMN_CHUNK = 16 << 20  # bytes of packed rows read at once when a band of columns is cut from them


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
    """(q - zero) * scale for q [n, K], zeros and scales [n, G], groups [K] each column's group. In fp32 and in
    place: small integers times an fp32 scale are exact there, and a float64 product would hold twice the band."""
    values = np.subtract(q, zeros[:, groups] if isinstance(zeros, np.ndarray) else zeros, dtype=np.float32)
    values *= scales[:, groups].astype(np.float32, copy=False)
    return values


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
        found = ints(stored, f"{stem}.g_idx", 0, k).astype(np.int64)
        if found.shape != (k,) or found.min(initial=0) < 0 or found.max(initial=0) >= count:
            raise UnsupportedModel(f"{stem}.g_idx does not map {k} columns onto {count} groups",
                                   hint="is the checkpoint intact?")
        return found
    size = group if group > 0 else k
    if -(-k // size) != count:
        raise UnsupportedModel(f"{stem}'s scales have {count} groups, but {k} columns in groups of {size} "
                               f"(config.json's group_size) make {-(-k // size)}",
                               hint="is config.json the checkpoint's own?")
    return np.arange(k) // size


def _groups(stored: Stored, scale: str, n: int) -> int:
    """How many groups a row's scales cover, from the scale's shape alone (one for the tensor: 1)."""
    size = int(np.prod(stored.shape(scale)))
    return 1 if size == 1 else size // n


def _scale_rows(stored: Stored, scale: str, count: int, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of a scale [N, G] (or the tensor's one, repeated), read as asked: never every weight's at open."""
    if int(np.prod(stored.shape(scale))) == 1:
        return np.broadcast_to(whole(stored, scale).reshape(1, 1), (r1 - r0, 1))
    return stored.rows(scale, r0, r1).reshape(r1 - r0, count)


def _matrix(stored: Stored, name: str) -> tuple[int, int]:
    shape = stored.shape(name)
    if len(shape) != 2 or stored.dtype(name) != "I32":
        raise UnsupportedModel(f"{name!r} is {stored.dtype(name)} {list(shape)}; packed weights are int32 matrices",
                               hint="is the checkpoint intact?")
    return shape[0], shape[1]


def _expect(stored: Stored, stem: str, shapes: dict[str, tuple[int, ...]], fmt: SourceFormat) -> None:
    """Each stored part of a quantized weight present with the shape its format and config.json imply."""
    for part, shape in shapes.items():
        name = f"{stem}.{part}"
        if name not in stored:
            raise UnsupportedModel(f"the {fmt.method} checkpoint lacks {name!r}", hint="is it a complete download?")
        if tuple(stored.shape(name)) != shape:
            raise UnsupportedModel(f"{name!r} is {list(stored.shape(name))}; {fmt.label} implies {list(shape)}",
                                   hint="is config.json's quantization_config the checkpoint's own?")


def gptq_view(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """qweight [K*b/32, N] packed along the input; qzeros [G, N*b/32] along the output; scales [G, N]."""
    words, n = _matrix(stored, f"{stem}.qweight")
    k, count = words * 32 // fmt.bits, stored.shape(f"{stem}.scales")[0]
    _expect(stored, stem, {"scales": (count, n), "qzeros": (count, n * fmt.bits // 32)}, fmt)

    def coded(r0: int, r1: int) -> Coded:
        q = unpack(_columns(stored, f"{stem}.qweight", r0, r1), fmt.bits, 0).T
        zeros = unpack(ints(stored, f"{stem}.qzeros", 0, count), fmt.bits, 1)[:, r0:r1].T + fmt.zero_offset
        return q, zeros, whole(stored, f"{stem}.scales")[:, r0:r1].T
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("qweight", "qzeros", "scales", "g_idx")))


def _awq_unpack(words: np.ndarray) -> np.ndarray:
    """AWQ's int32 words [.., W] -> [.., 8W] columns in order (nibble j holds column AWQ_ORDER[j])."""
    values = unpack(words, 4, words.ndim - 1)
    shaped = values.reshape(*values.shape[:-1], -1, 8)
    ordered = np.empty_like(shaped)
    ordered[..., AWQ_ORDER] = shaped
    return ordered.reshape(values.shape)


def awq_view(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """qweight [K, N/8] and qzeros [K/g, N/8] packed along the output; scales [K/g, N]; x @ W."""
    k, words = _matrix(stored, f"{stem}.qweight")
    n, count = words * 8, stored.shape(f"{stem}.scales")[0]
    _expect(stored, stem, {"scales": (count, n), "qzeros": (count, words)}, fmt)

    def coded(r0: int, r1: int) -> Coded:
        w0 = r0 // 8
        cut = slice(r0 - 8 * w0, r1 - 8 * w0)
        q = _awq_unpack(_columns(stored, f"{stem}.qweight", w0, -(-r1 // 8)))[:, cut].T
        zeros = _awq_unpack(ints(stored, f"{stem}.qzeros", 0, count))[:, r0:r1].T
        return q, zeros, whole(stored, f"{stem}.scales")[:, r0:r1].T
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("qweight", "qzeros", "scales")))


def packed_view(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """compressed-tensors' pack-quantized: weight_packed [N, K*b/32] along the input, signed values stored offset
    by 2^(b-1); weight_scale [N, G]; an asymmetric scheme's weight_zero_point packed along the output, offset alike
    (so codes and zeros are compared unsigned)."""
    n, words = _matrix(stored, f"{stem}.weight_packed")
    k = words * 32 // fmt.bits
    if f"{stem}.weight_shape" in stored:
        k = int(ints(stored, f"{stem}.weight_shape", 0, 2)[1])
    count = _groups(stored, f"{stem}.weight_scale", n)
    zero_name = f"{stem}.weight_zero_point"

    def coded(r0: int, r1: int) -> Coded:
        q = unpack(stored.packed_rows(f"{stem}.weight_packed", r0, r1), fmt.bits, 1)[:, :k]
        zeros = (unpack(ints(stored, zero_name, 0, stored.shape(zero_name)[0]), fmt.bits, 0)[r0:r1]
                 if zero_name in stored else 1 << (fmt.bits - 1))
        return q, zeros, _scale_rows(stored, f"{stem}.weight_scale", count, r0, r1)
    return _integer_view((n, k), coded, _group_of(stored, stem, k, fmt.group, count), fmt,
                         tuple(f"{stem}.{p}" for p in ("weight_packed", "weight_scale", "weight_zero_point")))


def integer_view(stored: Stored, stem: str, fmt: SourceFormat) -> View:
    """compressed-tensors' int-quantized: weight I8 [N, K], weight_scale [N, G] (or one), weight_zero_point."""
    n, k = stored.shape(f"{stem}.weight")
    count = _groups(stored, f"{stem}.weight_scale", n)
    groups = _group_of(stored, stem, k, fmt.group, count)
    zero_name = f"{stem}.weight_zero_point"

    def read(r0: int, r1: int) -> np.ndarray:
        q = stored.packed_rows(f"{stem}.weight", r0, r1).astype(np.int32)
        zeros = (np.broadcast_to(ints(stored, zero_name, 0, (stored.shape(zero_name) or (1,))[0])
                                 .reshape(-1, count), (n, count))[r0:r1] if zero_name in stored else 0.0)
        return _grid(q, zeros, _scale_rows(stored, f"{stem}.weight_scale", count, r0, r1), groups)
    return View((n, k), read, (f"{stem}.weight", f"{stem}.weight_scale", zero_name))
