"""One KV pool per server, counted in blocks of BLOCK tokens: the slots' caches and the prefix cache's entries.

The pool's size is the operator's (MBUILD_KV_CACHE_MB; by default every slot's whole context), not slots x context:
a slot holds the blocks its sequence has filled and the prompt it was admitted with (its reservation), and gives
them back when memory is wanted; the prefix cache's entries count by their tokens. Memory follows the count: a slot's
pages are committed as its positions are written (runtimes/engines/kv_memory.py) and handed back by `forget`, so
the process holds the pool's used blocks, not its size, and never more than its size beyond one run's padding.

Making room takes, in order: pages past each slot's length (a free slot's all: kept warm for its next sequence until
then), then the prefix cache's least recently used entries. What it cannot find there the scheduler takes from the
youngest sequence (preemption.py: it is preempted and recomputed later) or waits for.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from runtimes.generation.prefix_cache import BLOCK, PrefixCache


class PoolEngine(Protocol):
    """What the pool needs of the engine (runtimes/engines/decoder.py's DecoderEngine has it): per slot, the
    positions it holds and those its pages reach."""

    @property
    def lengths(self) -> np.ndarray: ...

    @property
    def written(self) -> np.ndarray: ...

    @property
    def bytes_per_token(self) -> int: ...

    def forget(self, slot: int, keep: int) -> None: ...


def blocks(tokens: int) -> int:
    return -(-int(tokens) // BLOCK)


class KvPool:
    def __init__(self, engine: PoolEngine, prefix: PrefixCache, context: int, capacity_bytes: int = 0) -> None:
        """capacity_bytes 0: every slot's whole context, where the prefix cache's entries take what the slots leave;
        a larger size gives them room of their own, up to the prefix cache's cap (no more could be used); never less
        than one block."""
        self.engine, self.prefix, self.slots = engine, prefix, len(engine.lengths)
        per_block = BLOCK * engine.bytes_per_token
        whole = self.slots * blocks(context)
        most = whole + prefix.capacity // per_block
        self.total = max(1, min(most, capacity_bytes // per_block)) if capacity_bytes else whole
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
        return -(-self.prefix.bytes // (BLOCK * self.engine.bytes_per_token))

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
        enough, the prefix cache's least recently used entries."""
        if self.free >= self.need(slot, tokens):
            return True
        lengths, written = self.engine.lengths, self.engine.written
        for other in range(self.slots):
            keep = max(int(lengths[other]), int(self.reserved[other]))
            if written[other] > blocks(keep) * BLOCK:
                self.engine.forget(other, blocks(keep) * BLOCK)
        while self.free < self.need(slot, tokens) and self.prefix.evict_oldest():
            pass
        return self.free >= self.need(slot, tokens)

    def room_for_prefix(self, tokens: int) -> bool:
        """Whether an entry of a `tokens`-token prompt (its whole blocks) fits beside what the slots hold, older
        entries going first; a prefix never takes a slot's blocks."""
        wanted = tokens // BLOCK
        while self.free < wanted and self.prefix.evict_oldest():
            pass
        return self.free >= wanted

    def describe(self) -> dict[str, int]:
        """The pool in the metrics' terms."""
        used = self.used
        return {"blocks_total": self.total, "blocks_used": used, "block_tokens": BLOCK,
                "tokens_capacity": self.capacity_tokens, "tokens_free": max(self.total - used, 0) * BLOCK}
