"""A model's tensors read straight from its safetensors files, a block of rows at a time.

The build never holds the model: a reader asks for rows [r0, r1) of one tensor and gets them in fp32,
read with pread from the file (bf16 and fp16 widened on the way), so memory follows the block asked
for, not the checkpoint. Reading rather than memory-mapping keeps it so: pages of a mapped file count
in the process's resident memory until the kernel reclaims them, which an 8B model's 16 GB would fill.
safetensors' own `safe_open` maps the file and hands whole tensors; there is no row-block read in it.

Sharded checkpoints (model-0000N-of-0000M.safetensors with an index) are read through the index; a
folder with pytorch_model*.bin instead is loaded with torch (memory-mapped), the format's only reader.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from builder.engine.dequant import Grid, View, views
from builder.errors import UnsupportedModel
from builder.model.quantization import source_format

MAX_HEADER = 100 << 20  # safetensors' own reader refuses headers past 100 MB
WIDTH = {"F32": 4, "F16": 2, "BF16": 2}
# read as stored: MXFP4's codes and scales, FP8 codes, packed int32 words, int8 values, g_idx and shapes
# (dequant.py decodes them)
PACKED = {"U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
          "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8}
INDEX = "model.safetensors.index.json"
# a pytorch_model.bin tensor's dtype by safetensors' name (older GPTQ checkpoints store their int32 words there)
TORCH_DTYPES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.int32": "I32",
                "torch.int8": "I8", "torch.uint8": "U8", "torch.int64": "I64", "torch.float8_e4m3fn": "F8_E4M3",
                "torch.float8_e5m2": "F8_E5M2", "torch.float8_e8m0fnu": "F8_E8M0"}


def _widen(raw: bytes | bytearray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return np.frombuffer(raw, np.float32).copy()
    if dtype == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float32)
    # bf16 is the top half of an fp32: widening is a shift, in place (a second block-sized array would raise the
    # build's peak by the block)
    wide = np.frombuffer(raw, np.uint16).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


class SafetensorsFile:
    """One file's header, checked against the file before any tensor is read."""

    def __init__(self, path: Path, stack: ExitStack) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        stack.callback(os.close, self.fd)
        size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, 8, 0)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER, size - 8):
            raise self._damaged("its header length is out of range")
        try:
            header = json.loads(os.pread(self.fd, length, 8))
        except ValueError as exc:
            raise self._damaged(f"its header is not JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise self._damaged("its header is not a JSON object")
        start = 8 + length
        self.tensors: dict[str, tuple[str, tuple[int, ...], int]] = {}
        for name, entry in header.items():
            if name != "__metadata__":
                dtype, shape, begin = self._entry(name, entry, size - start)
                self.tensors[name] = (dtype, shape, start + begin)

    def _entry(self, name: str, entry: Any, data_size: int) -> tuple[str, tuple[int, ...], int]:
        """(dtype, shape, offset in the data section), checked; other dtypes than WIDTH's are refused when
        read, not for being in the file (a checkpoint may carry an int buffer mbuild never reads)."""
        try:
            dtype, shape = str(entry["dtype"]), tuple(int(d) for d in entry["shape"])
            begin, end = (int(v) for v in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self._damaged(f"its entry for {name!r} is malformed ({exc})") from exc
        width = WIDTH.get(dtype, np.dtype(PACKED[dtype]).itemsize if dtype in PACKED else None)
        size_ok = width is None or end - begin == int(np.prod(shape)) * width
        if not (0 <= begin <= end <= data_size and size_ok and all(d >= 0 for d in shape)):
            raise self._damaged(f"tensor {name!r} lies outside the file or has the wrong size")
        return dtype, shape, begin

    def _damaged(self, why: str) -> UnsupportedModel:
        return UnsupportedModel(f"{self.path.name} is not a readable safetensors file: {why}",
                                hint="download the model again (mbuild cache rm, then package)")

    def rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        dtype, shape, offset = self.tensors[name]
        if dtype not in WIDTH:
            raise UnsupportedModel(f"tensor {name!r} in {self.path.name} is {dtype}, and its config names no "
                                   "quantization mbuild reads it by; mbuild reads F32, F16 and BF16 weights",
                                   hint="is config.json the one this checkpoint was saved with?")
        row = int(np.prod(shape[1:])) * WIDTH[dtype]
        raw = os.pread(self.fd, (r1 - r0) * row, offset + r0 * row)
        return _widen(raw, dtype).reshape((r1 - r0, *shape[1:]))

    def packed_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows of an integer or FP8 tensor as stored (no widening): a packed format's bytes or words."""
        dtype, shape, offset = self.tensors[name]
        if dtype not in PACKED:
            raise UnsupportedModel(f"tensor {name!r} in {self.path.name} is {dtype}, not a packed format's "
                                   f"({', '.join(PACKED)})")
        kind = np.dtype(PACKED[dtype])
        row = int(np.prod(shape[1:])) * kind.itemsize
        return np.frombuffer(os.pread(self.fd, (r1 - r0) * row, offset + r0 * row), kind).reshape(
            (r1 - r0, *shape[1:]))


def _config(model_dir: Path) -> dict[str, Any]:
    """config.json, for its quantization_config; {} where there is none to read (the plan has read it by now)."""
    try:
        found = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _indexed(index: Path) -> list[str]:
    """The shard files a sharded checkpoint's index names."""
    try:
        return sorted({str(file) for file in json.loads(index.read_text())["weight_map"].values()})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UnsupportedModel(f"{INDEX} is not a readable index ({exc!r})",
                               hint="download the model again (mbuild cache rm, then package)") from exc


class Checkpoint:
    """The model's tensors by name, read in fp32 a block of rows at a time."""

    def __init__(self, model_dir: Path, stack: ExitStack) -> None:
        self.files: dict[str, SafetensorsFile] = {}
        self.state: dict[str, Any] = {}
        # name -> (stored tensor, first row, end row): a part of a fused tensor that transformers splits by rows on
        # load (a fused q|k|v into q, k and v), read as a tensor of its own
        self.parts: dict[str, tuple[str, int, int]] = {}
        # name -> stored tensors: one that transformers joins by rows on load (q, k and v convolutions into one)
        self.joins: dict[str, list[str]] = {}
        index = model_dir / INDEX
        names = _indexed(index) if index.is_file() else sorted(p.name for p in model_dir.glob("*.safetensors"))
        for file_name in names:
            path = model_dir / Path(file_name).name  # an index names files beside it, never elsewhere
            if not path.is_file():
                raise UnsupportedModel(f"{path.name}, named by {INDEX}, is missing", hint="is it a complete download?")
            opened = SafetensorsFile(path, stack)
            self.files.update({name: opened for name in opened.tensors})
        if not names:
            import torch

            for path in sorted(model_dir.glob("pytorch_model*.bin")):
                self.state.update(torch.load(path, map_location="cpu", mmap=True, weights_only=True))
        if not self.files and not self.state:
            raise UnsupportedModel(f"no safetensors or pytorch_model.bin weights in {model_dir}")
        # a pre-quantized checkpoint's weights by the module's names, decoded when read (dequant.py)
        fmt = source_format(_config(model_dir))
        self.format = fmt.label if fmt else ""
        self.decoded: dict[str, View] = {}
        self.decoded = views(self, [*self.files, *self.state], fmt) if fmt else {}

    def __contains__(self, name: str) -> bool:
        return (name in self.files or name in self.state or name in self.parts or name in self.joins
                or name in self.decoded)

    def names(self) -> list[str]:
        """The weights' names: the stored tensors', a quantized weight's by the module's name for it (not the
        parts')."""
        consumed = {part for view in self.decoded.values() for part in view.parts} - self.decoded.keys()
        return [*(n for n in self.files if n not in consumed), *self.decoded.keys() - self.files.keys(), *self.state]

    def grid(self, name: str) -> Grid | None:
        """A pre-quantized weight's codes where a build may keep them (dequant.Grid); None for any other weight."""
        view = self.decoded.get(name)
        return view.grid if view else None

    def dtype(self, name: str) -> str:
        """A stored tensor's safetensors dtype (F32 for a decoded weight)."""
        if name in self.decoded:
            return "F32"
        if name in self.files:
            return self.files[name].tensors[name][0]
        return TORCH_DTYPES.get(str(self.state[name].dtype), "F32") if name in self.state else "F32"

    def shape(self, name: str) -> tuple[int, ...]:
        self._check(name)
        if name in self.decoded:
            return self.decoded[name].shape
        if name in self.parts:
            source, r0, r1 = self.parts[name]
            return (r1 - r0, *self.shape(source)[1:])
        if name in self.joins:
            shapes = [self.shape(source) for source in self.joins[name]]
            return (sum(shape[0] for shape in shapes), *shapes[0][1:])
        return self.files[name].tensors[name][1] if name in self.files else tuple(self.state[name].shape)

    def _check(self, name: str) -> None:
        if name not in self:
            raise UnsupportedModel(f"the checkpoint lacks tensor {name!r}", hint="is it a complete download?")

    def rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        self._check(name)
        if name in self.decoded:
            return self.decoded[name].rows(r0, r1)
        if name in self.parts:
            source, first, _ = self.parts[name]
            return self.rows(source, first + r0, first + r1)
        if name in self.joins:
            return self._joined(name, r0, r1, self.rows)
        if name in self.files:
            return self.files[name].rows(name, r0, r1)
        return np.ascontiguousarray(self.state[name][r0:r1].float().numpy())

    def packed_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        self._check(name)
        if name in self.parts:
            source, first, _ = self.parts[name]
            return self.packed_rows(source, first + r0, first + r1)
        if name in self.joins:
            return self._joined(name, r0, r1, self.packed_rows)
        if name in self.files:
            return self.files[name].packed_rows(name, r0, r1)
        tensor = self.state[name][r0:r1]
        if str(tensor.dtype).startswith("torch.float8"):  # numpy has no FP8: its bytes, as safetensors' are read
            import torch

            tensor = tensor.view(torch.uint8)
        return np.ascontiguousarray(tensor.numpy())

    def get(self, name: str) -> np.ndarray:
        return self.rows(name, 0, self.shape(name)[0])

    def blocks(self, names: list[str], max_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
        """Rows of the tensors stacked along their first axis, as (first row, fp32 block) of <= max_bytes each."""
        first = 0
        for name in names:
            shape = self.shape(name)
            step = max(1, max_bytes // (4 * int(np.prod(shape[1:]))))
            for r0 in range(0, shape[0], step):
                block = self.rows(name, r0, min(r0 + step, shape[0]))
                yield first + r0, block
            first += shape[0]

    def _joined(self, name: str, r0: int, r1: int, read: Any) -> np.ndarray:
        """Rows r0..r1 of a joined tensor: each stored tensor's rows that fall within them, in order."""
        pieces, first = [], 0
        for source in self.joins[name]:
            rows = self.shape(source)[0]
            lo, hi = max(r0, first), min(r1, first + rows)
            if lo < hi:
                pieces.append(read(source, lo - first, hi - first))
            first += rows
        return np.concatenate(pieces)
