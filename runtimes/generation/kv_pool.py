"""One KV pool per server, counted in blocks of BLOCK tokens: the slots' caches and the prefix cache's copies.

The pool's size is the operator's (MBUILD_KV_CACHE_MB; by default every slot's whole context), not slots x context:
a slot holds the blocks its sequence has filled and the prompt it was admitted with (its reservation), and a free
slot the blocks of its resident prefix-cache entry (prefix_cache.py: what its last sequence left, for the next one
that starts the same way); the prefix cache's copies count by their tokens. Memory follows the count: a slot's pages
are committed as its positions are written (runtimes/engines/kv_memory.py) and handed back by `forget`, so the process
holds the pool's used blocks, not its size, and never more than its size beyond one run's padding.

Making room takes, in order: pages past what each slot holds, then the prefix cache's least recently used entries
that free memory (copies, and free slots' resident entries, whose pages then go). What it cannot find there the
scheduler takes from the youngest sequence (preemption.py: it is preempted and recomputed later) or waits for.
"""

from __future__ import annotations

import numpy as np

from runtimes.engines.contract import SlotEngine
from runtimes.generation.prefix_cache import BLOCK, PrefixCache


def blocks(tokens: int) -> int:
    return -(-int(tokens) // BLOCK)


class KvPool:
    def __init__(self, engine: SlotEngine, prefix: PrefixCache, context: int, capacity_bytes: int = 0) -> None:
        """capacity_bytes 0: every slot's whole context, where the prefix cache's entries take what the slots leave;
        a larger size gives them room of their own, up to the prefix cache's cap (no more could be used); never less
        than one block."""
        self.engine, self.prefix, self.slots = engine, prefix, len(engine.lengths)
        per_block = BLOCK * engine.bytes_per_token  # 0 for a model of recurrent layers alone: no cache to pool
        whole = self.slots * blocks(context)
        most = whole + prefix.capacity // per_block if per_block else whole
        self.total = max(1, min(most, capacity_bytes // per_block)) if capacity_bytes and per_block else whole
        self.reserved = np.zeros(self.slots, np.int64)  # per slot, the positions it was admitted to fill

    @property
    def capacity_tokens(self) -> int:
        return self.total * BLOCK

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.engine.bytes_per_token

    def held(self, slot: int) -> int:
        """Blocks the slot holds: what its pages reach or what it was admitted to fill, whichever is more."""
        return blocks(max(int(self.engine.written[slot]), int(self.reserved[slot])))

    @property
    def prefix_blocks(self) -> int:
        return -(-self.prefix.bytes // (BLOCK * self.engine.bytes_per_token)) if self.engine.bytes_per_token else 0

    @property
    def used(self) -> int:
        reach = np.maximum(self.engine.written, self.reserved)
        return int(((reach + BLOCK - 1) // BLOCK).sum()) + self.prefix_blocks

    @property
    def free(self) -> int:
        return self.total - self.used

    def need(self, slot: int, tokens: int) -> int:
        """Blocks more the slot takes to hold `tokens` more positions past its length."""
        return max(0, blocks(int(self.engine.lengths[slot]) + tokens) - self.held(slot))

    def reserve(self, slot: int, tokens: int) -> None:
        self.reserved[slot] = tokens

    def release(self, slot: int) -> None:
        """The slot's sequence ended or gave its blocks up: its reservation goes, its pages when room is made."""
        self.reserved[slot] = 0

    def make_room(self, slot: int, tokens: int) -> bool:
        """Whether the slot can take `tokens` more positions, after handing back stale pages and, if that is not
        enough, the prefix cache's least recently used entries (never the slot's own)."""
        if self.free >= self.need(slot, tokens):
            return True
        for other in range(self.slots):
            self._trim(other)
        while self.free < self.need(slot, tokens) and self._evict(slot):
            pass
        return self.free >= self.need(slot, tokens)

    def room_for_prefix(self, tokens: int) -> bool:
        """Whether a copied entry of `tokens` tokens (its whole blocks) fits in what the pool has free: a copy kept
        of a re-let slot's prefix never takes a running sequence's blocks, nor newer entries' (it is the oldest)."""
        return self.free >= tokens // BLOCK

    def _idle(self, slot: int) -> bool:
        return not self.engine.lengths[slot] and not self.reserved[slot]

    def _trim(self, slot: int) -> None:
        """Hand back the slot's pages past its sequence (its length or reservation) or its resident entry."""
        keep = blocks(max(int(self.engine.lengths[slot]), int(self.reserved[slot]),
                          self.prefix.resident_tokens(slot))) * BLOCK
        if self.engine.written[slot] > keep:
            self.engine.forget(slot, keep)

    def _evict(self, spare: int | None) -> bool:
        """The least recently used entry whose going frees memory: a copy, or the resident entry of a free slot
        other than `spare` (its pages go with it)."""
        gone = self.prefix.evict_oldest(lambda entry: entry.slot is None or
                                        (entry.slot != spare and self._idle(entry.slot)))
        if gone is None:
            return False
        if gone.slot is not None:
            self._trim(gone.slot)
        return True

    def describe(self) -> dict[str, int]:
        """The pool in the metrics' terms."""
        used = self.used
        return {"blocks_total": self.total, "blocks_used": used, "block_tokens": BLOCK,
                "tokens_capacity": self.capacity_tokens, "tokens_free": max(self.total - used, 0) * BLOCK}
