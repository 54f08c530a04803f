"""Weights written to the engine's external-data file as they are read, quantized on the way when the profile asks.

A linear layer's weight arrives from the checkpoint a block of output rows at a time (checkpoint.py) and
leaves as the operator ONNX Runtime's quantizers would have made, written in place in the data file:
  fp32                   MatMul, weight [K, N]
  int8 ("dynamic")       DynamicQuantizeMatMul: int8 weight [K, N], one scale per output channel (or one
                         for the tensor), activations quantized per step; what quantize_dynamic followed by
                         the graph optimizer produces
  int4 / 8-bit blocks    MatMulNBits, weight [N, blocks, bytes], packed by ONNX Runtime's own kernel
                         (quantize_matmul_4bits / _8bits), as MatMulNBitsQuantizer does
  8-bit tiles            the same 8-bit blocks of 128 in MatMulInt8Tiles' layout (int8_tiles.py), for mbuild's
                         kernel
Why not run those quantizers on a finished graph: both load the whole ONNX model (and the graph optimizer
saves a second copy), which for an 8B model is tens of GB; here memory holds one block of rows.
The rounding is the libraries' own (quantize_nparray, get_qmin_qmax_for_qType, the packing kernels).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import _pybind_state as ort_kernels
from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType, quantize_nparray

from builder.engine import int8_tiles
from builder.engine.checkpoint import Checkpoint
from builder.engine.dequant import Grid
from builder.errors import UnsupportedModel
from builder.planning.engine_options import OrtOptions

DATA_FILE = "model.onnx.data"
ALIGN = 64
INLINE_BYTES = 1024
# fp32 bytes of checkpoint rows handled at once: the working set a build holds beside its own process, so it sets
# the build's peak on small models (docs/benchmarks/llm_notes.md, "The streamed export")
BLOCK_BYTES = 32 << 20
Linear = tuple[str, list[str], dict[str, Any]]  # op type, weight initializers, attributes
# An attribute a Linear may carry that is no attribute of its op: the initializer of the input columns' order its
# weight was written in (a GPTQ act-order grid kept); the caller gathers the input by it (decoder_graph.linear)
INPUT_ORDER = "input_order"


@dataclass(frozen=True)
class LinearFormat:
    """How linear layers are stored: fp32, int8 (dynamic) or n-bit blocks; from a profile's engine options."""

    kind: str = "fp32"  # fp32 | int8 | nbits
    per_channel: bool = True
    reduce_range: bool = False
    bits: int = 4
    block_size: int = 128
    accuracy_level: int = 0
    tiles: bool = False  # 8-bit blocks of 128 for MatMulInt8Tiles instead of MatMulNBits

    @classmethod
    def for_profile(cls, precision: str, options: OrtOptions) -> LinearFormat:
        bits = options.block_bits(precision)
        if bits is None:
            return cls() if precision == "fp32" else cls("int8", per_channel=options.per_channel,
                                                             reduce_range=options.reduce_range)
        return cls("nbits", bits=bits, block_size=options.block_size, accuracy_level=options.accuracy_level or 0,
                   tiles=options.quantization == "tiles")


class WeightFile:
    """Initializers placed in one external-data file; the graph keeps only their names and offsets."""

    def __init__(self, fd: int) -> None:
        self.fd, self.end = fd, 0
        self.initializers: list[TensorProto] = []

    def reserve(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Room for a tensor filled later with `put`; returns its offset in the file."""
        self.end += -self.end % ALIGN
        offset, nbytes = self.end, int(np.prod(shape)) * np.dtype(dtype).itemsize
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", DATA_FILE), ("offset", offset), ("length", nbytes)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self.initializers.append(tensor)
        self.end += nbytes
        os.ftruncate(self.fd, self.end)
        return offset

    def put(self, offset: int, array: np.ndarray) -> None:
        os.pwrite(self.fd, np.ascontiguousarray(array).data, offset)

    def put_columns(self, offset: int, columns: np.ndarray, first: int, width: int) -> None:
        """columns [K, n] into a [K, width] tensor at column `first`: one write per row."""
        row = width * columns.itemsize
        for k in range(columns.shape[0]):
            self.put(offset + k * row + first * columns.itemsize, columns[k])

    def add(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array, order="C")  # not ascontiguousarray, which makes a scalar (a Gather index) [1]
        if array.nbytes < INLINE_BYTES:  # shape inference reads small constants (Slice bounds) from the graph
            self.initializers.append(numpy_helper.from_array(array, name))
        else:
            self.put(self.reserve(name, array.shape, array.dtype), array)
        return name


def int8_scales(absmax: np.ndarray, reduce_range: bool) -> np.ndarray:
    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8, reduce_range=reduce_range, symmetric=True)
    scale = (absmax.astype(np.float64) * 2 / (float(qmax) - float(qmin))).astype(np.float32)
    return np.where(scale < np.finfo(np.float32).tiny, np.float32(1.0), scale)


def int8_rows(block: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Rows [n, K] quantized symmetric int8 with a scale per row ([n, 1]) or one scale."""
    return quantize_nparray(TensorProto.INT8, block, scale, np.int8(0))


class LinearWriter:
    """Writes x @ W.T for checkpoint weights W [N, K] (several stacked along N) in a LinearFormat."""

    def __init__(self, weights: WeightFile, checkpoint: Checkpoint, form: LinearFormat) -> None:
        self.weights, self.checkpoint, self.form = weights, checkpoint, form

    def __call__(self, names: list[str], name: str) -> Linear:
        """The weight written; returns (op type, its initializer inputs, attributes)."""
        n = sum(self.checkpoint.shape(t)[0] for t in names)
        k = self.checkpoint.shape(names[0])[1]
        if self.form.kind == "int8":
            return self._int8(names, name, n, k)
        if self.form.kind == "nbits":
            return self._tiles(names, name, n, k) if self.form.tiles else self._nbits(names, name, n, k)
        offset = self.weights.reserve(f"{name}.weight", (k, n), np.dtype(np.float32))
        for first, block in self.checkpoint.blocks(names, BLOCK_BYTES):
            self.weights.put_columns(offset, np.ascontiguousarray(block.T), first, n)
        return "MatMul", [f"{name}.weight"], {}

    def _int8(self, names: list[str], name: str, n: int, k: int) -> Linear:
        form = self.form
        if form.per_channel:
            scale = None
        else:  # one scale for the tensor: a first pass finds its range
            absmax = max(float(np.abs(b).max()) for _, b in self.checkpoint.blocks(names, BLOCK_BYTES))
            scale = int8_scales(np.array([absmax]), form.reduce_range)
        offset = self.weights.reserve(f"{name}.weight_quantized", (k, n), np.dtype(np.int8))
        scales = []
        for first, block in self.checkpoint.blocks(names, BLOCK_BYTES):
            rows = scale
            if rows is None:  # per channel: each output row's own scale
                rows = int8_scales(np.abs(block).max(axis=1), form.reduce_range)
                scales.append(rows)
            quantized = int8_rows(block, rows.reshape(-1, 1))
            self.weights.put_columns(offset, np.ascontiguousarray(quantized.T), first, n)
        scale_all = np.concatenate(scales) if scale is None else scale.reshape(())
        self.weights.add(f"{name}.weight_scale", scale_all)
        self.weights.add(f"{name}.weight_zero_point", np.zeros(scale_all.shape, np.int8))
        return "DynamicQuantizeMatMul", [f"{name}.weight_quantized", f"{name}.weight_scale",
                                         f"{name}.weight_zero_point"], {}

    def _nbits(self, names: list[str], name: str, n: int, k: int) -> Linear:
        bits, block_size = self.form.bits, self.form.block_size
        grids = [self.checkpoint.grid(t) for t in names]
        kept = [g for g in grids if g is not None and g.bits == bits and g.group == block_size]
        orders = [g.order for g in kept]
        if len(kept) == len(names) and all(_same(order, orders[0]) for order in orders):  # fused: one input order
            return self._kept(names, kept, name, n, k)
        blocks, blob = -(-k // block_size), block_size * bits // 8
        offset = self.weights.reserve(f"{name}.weight_q{bits}", (n, blocks, blob), np.dtype(np.uint8))
        scales = []
        for first, block in self.checkpoint.blocks(names, BLOCK_BYTES):
            packed, scale = pack_rows(block, bits, block_size)
            self.weights.put(offset + first * blocks * blob, packed)
            scales.append(scale)
        self.weights.add(f"{name}.weight_scales", np.concatenate(scales))
        attributes = self._nbits_attributes(k, n)
        return "MatMulNBits", [f"{name}.weight_q{bits}", f"{name}.weight_scales"], attributes

    def _nbits_attributes(self, k: int, n: int) -> dict[str, Any]:
        attributes: dict[str, Any] = {"K": k, "N": n, "bits": self.form.bits, "block_size": self.form.block_size}
        if self.form.accuracy_level:
            attributes["accuracy_level"] = self.form.accuracy_level
        return attributes

    def _kept(self, names: list[str], grids: list[Grid], name: str, n: int, k: int) -> Linear:
        """A pre-quantized weight's own codes, zero points and scales as MatMulNBits' blocks (its groups are the
        blocks): the engine computes with the checkpoint's values, not a second rounding of them."""
        bits, block_size = self.form.bits, self.form.block_size
        blocks, blob = -(-k // block_size), block_size * bits // 8
        zero_blob = -(-blocks * bits // 8)
        codes = self.weights.reserve(f"{name}.weight_q{bits}", (n, blocks, blob), np.dtype(np.uint8))
        zeros = self.weights.reserve(f"{name}.weight_zero_points", (n, zero_blob), np.dtype(np.uint8))
        scales = self.weights.reserve(f"{name}.weight_scales", (n, blocks), np.dtype(np.float32))
        first, order = 0, grids[0].order
        for source, grid in zip(names, grids, strict=True):
            rows = self.checkpoint.shape(source)[0]
            step = max(1, BLOCK_BYTES // (4 * k))
            for r0 in range(0, rows, step):
                q, zero, scale = grid.coded(r0, min(r0 + step, rows))
                zero = np.broadcast_to(np.asarray(zero), (len(q), blocks))
                if zero.min() < 0 or zero.max() >= 1 << bits:
                    raise UnsupportedModel(f"{source!r} has zero points outside {bits} bits, which MatMulNBits "
                                           "cannot hold", hint="build it at --precision int8 or fp32")
                at = first + r0
                whole = np.zeros((len(q), blocks * block_size), np.uint8)  # a last block past K: its codes unread
                whole[:, :k] = q if order is None else q[:, order]
                self.weights.put(codes + at * blocks * blob, _packed_low_first(whole.reshape(len(q), blocks, -1), bits))
                self.weights.put(zeros + at * zero_blob, _packed_low_first(zero, bits, pad=zero_blob))
                self.weights.put(scales + at * blocks * 4, scale.astype(np.float32))
            first += rows
        attributes = self._nbits_attributes(k, n)
        if order is not None:  # the weight's columns were written in this order: the input's must be gathered so
            attributes[INPUT_ORDER] = self.weights.add(f"{name}.input_order", order.astype(np.int64))
        return "MatMulNBits", [f"{name}.weight_q{bits}", f"{name}.weight_scales", f"{name}.weight_zero_points"], \
            attributes

    def _tiles(self, names: list[str], name: str, n: int, k: int) -> Linear:
        """Whole groups of 64 rows at a time: the checkpoint's blocks of rows end anywhere, a group may straddle two."""
        groups, blocks = -(-n // int8_tiles.GROUP), -(-k // int8_tiles.BLOCK)
        group_bytes = blocks * int8_tiles.BLOCK * int8_tiles.GROUP
        weights = self.weights.reserve(f"{name}.weight_tiles", (groups, blocks, int8_tiles.QUADS, int8_tiles.GROUP, 4),
                                       np.dtype(np.uint8))
        scales = self.weights.reserve(f"{name}.weight_tile_scales", (groups, blocks, int8_tiles.GROUP),
                                      np.dtype(np.float32))
        done, carry = 0, np.zeros((0, k), np.float32)
        for first, block in self.checkpoint.blocks(names, BLOCK_BYTES):
            rows = np.concatenate([carry, block])
            whole = len(rows) if first + len(block) == n else len(rows) // int8_tiles.GROUP * int8_tiles.GROUP
            if whole:
                tiles, tile_scales = int8_tiles.tile_weights(*pack_rows(rows[:whole], 8, int8_tiles.BLOCK))
                self.weights.put(weights + done * group_bytes, tiles)
                self.weights.put(scales + done * blocks * int8_tiles.GROUP * 4, tile_scales)
                done += len(tiles)
            carry = rows[whole:]
        return int8_tiles.OP, [f"{name}.weight_tiles", f"{name}.weight_tile_scales"], int8_tiles.attributes(k, n)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def _packed_low_first(values: np.ndarray, bits: int, pad: int = 0) -> np.ndarray:
    """Unsigned values along the last axis packed 8/bits a byte, the first in the lowest bits (MatMulNBits'
    order), the last axis padded to `pad` bytes."""
    per = 8 // bits
    width = max(pad * per, -(-values.shape[-1] // per) * per)
    padded = np.zeros((*values.shape[:-1], width), np.uint8)
    padded[..., : values.shape[-1]] = values
    grouped = padded.reshape(*values.shape[:-1], -1, per)
    out = np.zeros(grouped.shape[:-1], np.uint8)
    for i in range(per):
        out |= grouped[..., i] << np.uint8(i * bits)
    return out


def pack_rows(block: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [n, K] in symmetric blocks of `block_size` along K, packed by ONNX Runtime's kernel as MatMulNBits
    and GatherBlockQuantized read them: ([n, blocks, bytes] uint8, offset by 2^(bits-1); scales [n, blocks])."""
    rows, k = block.shape
    blocks = -(-k // block_size)
    columns = np.zeros((blocks * block_size, rows), np.float32)  # K padded to whole blocks
    columns[:k] = block.T
    packed = np.zeros((rows, blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((rows, blocks), np.float32)
    zero_points = np.zeros((rows, -(-blocks * bits // 8)), np.uint8)  # not written: symmetric
    pack = ort_kernels.quantize_matmul_4bits if bits == 4 else ort_kernels.quantize_matmul_8bits
    pack(packed, columns, scales, zero_points, block_size, rows, blocks * block_size, True)
    return packed, scales
