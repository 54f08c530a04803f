"""The KV cache's memory: reserved for every slot's whole context, committed only where positions are written.

Each buffer is [slots, kv_heads, context, head_dim], the layout ONNX Runtime's CPU GroupQueryAttention reads in
place: a run binds a contiguous range of slots as one tensor, so every slot keeps one address range. Its pages come
from an anonymous private mapping, which the kernel commits on first write and takes back on MADV_DONTNEED: a slot
holds the pages of the positions it has written, not its whole context (as llama.cpp's cache is touched as it fills).
ONNX Runtime's PagedAttention, the op that reads a block table, has no CPU kernel in 1.32 (measured: "Could not find
an implementation for PagedAttention(1)"; its schema takes fp16 and bf16 only), so fixed-size blocks are the pool's
unit of account (runtimes/generation/kv_pool.py), and this is the memory behind them.

Transparent huge pages are turned off for these mappings: with THP on ("always" on common hosts), the first token a
head wrote committed a 2 MB page (measured on one attention node: 16 tokens in each of 2 slots committed 42 MB, 2 MB
for each of 5 heads, 2 slots, keys and values), so on the ~100M Llama's 512 KB head ranges a slot's first token would
commit its whole context (test_decoder_graph holds a slot to the pages it writes).
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


class KvBuffer:
    """One reserved [slots, kv_heads, context, head_dim] buffer; `forget` hands positions' pages back."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self._map = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            self._map.madvise(mmap.MADV_NOHUGEPAGE)
        self.array: np.ndarray = np.frombuffer(self._map, dtype, int(np.prod(shape))).reshape(shape)
        self.row_bytes = shape[3] * dtype.itemsize  # one position of one head
        self.region_bytes = shape[2] * self.row_bytes  # one head of one slot

    def forget(self, slot: int, keep: int, written: int) -> None:
        """Give back the pages that hold only positions keep..written-1 of `slot`'s every head (the page where
        position `keep` starts stays when it also holds earlier ones); those positions read as zeros after."""
        if written <= keep:
            return
        for head in range(self.shape[1]):
            start = (slot * self.shape[1] + head) * self.region_bytes
            low = -(-(start + keep * self.row_bytes) // PAGE) * PAGE
            high = min(-(-(start + written * self.row_bytes) // PAGE) * PAGE,
                       (start + self.region_bytes) // PAGE * PAGE)
            if high > low:
                self._map.madvise(mmap.MADV_DONTNEED, low, high - low)
