"""Prefix cache: KV already computed for a token sequence, so a prompt that starts the same way skips it.

Two kinds of entry share one index:
- resident: a slot's own cache, positions 0..k (k a multiple of BLOCK), as a sequence left them. A prompt's whole
  blocks are pinned when its prefill ends, and its answer's when the sequence ends; the slot keeps them after its
  sequence leaves (its pages stay committed, counted by the KV pool), and the scheduler places a prompt that starts
  the same way in that slot (scheduler.py), which goes on from there: a conversation's next turn copies nothing.
- copied: a copy of some slot's first k positions in arrays of its own, bounded in bytes (capacity): what a free
  slot's entry becomes when another prompt takes the slot and the pool has room to keep it (vacate), or what a
  Dynamo decode worker takes in from a prefill worker (adopt; runtimes/dynamo/kv_transfer.py).
A new prompt reuses the longest block-aligned prefix that some entry holds, leaving at least one token to prefill (its
logits start the sequence): in place when the entry is resident in the slot the prompt takes, else copied there.
Lookups go through a chain hash per block (a block's key is the hash of the previous key and its tokens), and a hit
is confirmed on the tokens themselves, so a hash collision can cost a miss, never a wrong cache. Both kinds are used
and evicted in one least-recently-used order. With a `journal`, a block that gains its first holder is recorded as
("stored", its tokens, keys, the key before them) and one that loses its last as ("removed", (), keys, None): what a
Dynamo worker publishes as KV events (runtimes/dynamo/engine.py).

Threads: the scheduler's thread pins, vacates and restores; a Dynamo prefill worker's KV server exports and a decode
worker adopts on other threads, so the index changes under the lock, and an exported resident entry is read under it:
the scheduler shrinks or drops a slot's entry, under the lock, before anything overwrites those positions. Copied
entries' arrays are never written after they are made.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runtimes.bundle.engine import KV_BLOCK_TOKENS
from runtimes.engines.contract import SlotEngine
from runtimes.metrics import Metrics

BLOCK = KV_BLOCK_TOKENS  # the reuse granularity (llama.cpp reuses per token)


@dataclass
class Entry:
    tokens: tuple[int, ...]
    blocks: list[np.ndarray] = field(default_factory=list)  # a copied entry's positions
    nbytes: int = 0  # a copied entry's bytes (a resident one's pages are its slot's)
    slot: int | None = None  # resident: the slot whose cache holds the positions


Journaled = tuple[str, tuple[int, ...], tuple[int, ...], int | None]  # kind, tokens, block keys, parent key
Room = Callable[[int], bool]  # whether the KV pool has room for a copy of this many tokens


def block_keys(tokens: list[int] | tuple[int, ...], limit: int) -> list[int]:
    """keys[j] identifies tokens[:(j + 1) * BLOCK], for every whole block within the first `limit` tokens."""
    keys, key = [], 0
    for end in range(BLOCK, limit + 1, BLOCK):
        key = hash((key, tuple(tokens[end - BLOCK:end])))
        keys.append(key)
    return keys


def _common(held: tuple[int, ...], prompt: list[int]) -> int:
    """Whole blocks of `held` that the prompt starts with, leaving the prompt's last token to run."""
    most = min(len(held), len(prompt) - 1) // BLOCK * BLOCK
    for end in range(BLOCK, most + 1, BLOCK):
        if held[end - BLOCK:end] != tuple(prompt[end - BLOCK:end]):
            return end - BLOCK
    return most


class PrefixCache:
    def __init__(self, capacity_bytes: int, slots: SlotEngine | None = None) -> None:
        """capacity_bytes: the copied entries' bound (0: no prefix cache at all); slots: the engine whose slots hold
        resident entries (export reads them there)."""
        self.capacity, self.slots = capacity_bytes, slots
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # by id, LRU first
        self.index: dict[int, list[int]] = {}  # block key -> ids of the entries holding that prefix, newest last
        self.resident: dict[int, int] = {}  # slot -> its resident entry's id
        self.bytes = 0  # the copied entries'
        self.queried = self.reused = 0  # prompt tokens looked up, and of them restored (the hit rate's terms)
        self.journal: collections.deque[Journaled] | None = None  # KV events, for whoever publishes them
        self.lock = threading.Lock()
        self._ids = itertools.count()

    @property
    def on(self) -> bool:
        return self.capacity > 0

    def lookup(self, prompt: list[int], limit: int | None = None,
               prefer: int | None = None) -> tuple[Entry | None, int]:
        """The entry and the number of leading prompt tokens it can supply (0: a miss), at most `limit` (default:
        all but the last token, whose logits start the sequence); of equally long ones, the entry resident in slot
        `prefer`, else the newest."""
        if not self.on:
            return None, 0
        keys = block_keys(prompt, len(prompt) - 1 if limit is None else limit)
        with self.lock:
            return self._longest(prompt, keys, prefer)

    def _longest(self, prompt: list[int], keys: list[int], prefer: int | None) -> tuple[Entry | None, int]:
        for j in range(len(keys) - 1, -1, -1):
            length = (j + 1) * BLOCK
            for ident in sorted(reversed(self.index.get(keys[j], [])), key=lambda i: self.entries[i].slot != prefer):
                entry = self.entries[ident]
                if entry.tokens[:length] == tuple(prompt[:length]):
                    self.entries.move_to_end(ident)
                    return entry, length
        return None, 0

    def count(self, metrics: Metrics, prompt: int, reused: int) -> None:
        """One lookup in the metrics: prompt tokens asked for, and how many came from the cache."""
        metrics.inc("prefix_cache_queries_total")
        metrics.inc("prefix_cache_query_tokens_total", prompt)
        metrics.inc("prefix_cache_hits_total", 1 if reused else 0)
        metrics.inc("prefix_cache_hit_tokens_total", reused)
        self.queried += prompt
        self.reused += reused
        metrics.set("prefix_cache_hit_rate", self.reused / self.queried)

    # --- the slots' own entries ------------------------------------------------------------
    def resident_tokens(self, slot: int) -> int:
        with self.lock:
            ident = self.resident.get(slot)
            return len(self.entries[ident].tokens) if ident is not None else 0

    def best_slot(self, prompt: list[int], free: list[int]) -> int | None:
        """Of the free slots, the one whose resident entry supplies most of the prompt (at least a block)."""
        with self.lock:
            found = [(_common(self.entries[self.resident[s]].tokens, prompt), s) for s in free if s in self.resident]
        most = max(found, default=(0, 0))
        return most[1] if most[0] else None

    def coldest(self, slots: list[int]) -> int:
        """Of these slots, one without a resident entry, else the one whose entry was used longest ago."""
        with self.lock:  # other threads reorder the entries (export, adopt)
            order = {ident: rank for rank, ident in enumerate(self.entries)}
            return min(slots, key=lambda s: order.get(self.resident.get(s, -1), -1))

    def pin(self, slot: int, tokens: list[int] | tuple[int, ...]) -> None:
        """The slot's cache holds `tokens` from position 0: their whole blocks become its resident entry."""
        if not self.on:
            return
        keys = block_keys(tokens, len(tokens))
        with self.lock:
            self._pin(slot, tuple(tokens[:len(keys) * BLOCK]), keys)

    def _pin(self, slot: int, tokens: tuple[int, ...], keys: list[int]) -> None:
        old = self.resident.pop(slot, None)
        if keys:  # added before the old one goes, so the blocks both hold are never reported removed
            self.resident[slot] = self._add(tokens, keys, Entry(tokens, slot=slot))
        if old is not None:
            self._drop(old)

    def unpin(self, slot: int) -> None:
        """The slot's positions are going (its pages handed back): its resident entry goes with them."""
        with self.lock:
            ident = self.resident.pop(slot, None)
            if ident is not None:
                self._drop(ident)

    def vacate(self, cache: SlotEngine, slot: int, keep: int, room: Room) -> None:
        """A new sequence takes the slot, keeping its first `keep` positions: what its resident entry holds past them
        becomes a copied entry first when that is a block or more and `room` holds it, else it is forgotten."""
        with self.lock:
            ident = self.resident.get(slot)
            if ident is None:
                return
            held = self.entries[ident].tokens
        if len(held) <= keep:
            return
        if len(held) - keep >= BLOCK and len(held) * cache.bytes_per_token <= self.capacity and room(len(held)):
            copy = cache.read(slot, len(held))
            with self.lock:
                if self.resident.get(slot) == ident:  # another thread's adopt may have evicted it meanwhile
                    entry = self.entries[self.resident.pop(slot)]
                    entry.blocks, entry.nbytes, entry.slot = copy, len(held) * cache.bytes_per_token, None
                    self.bytes += entry.nbytes
                    self.entries.move_to_end(ident)
                    while self.bytes > self.capacity and self._evict_copied():
                        pass
        keep = min(keep, len(held)) // BLOCK * BLOCK
        with self.lock:
            self._pin(slot, held[:keep], block_keys(held, keep))

    def restore(self, cache: SlotEngine, slot: int, prompt: list[int], room: Room = lambda _: False) -> int:
        """Fill the slot with the longest cached prefix of the prompt (in place when the slot's own entry holds it);
        returns the tokens it now holds. The slot's entry past them is vacated first."""
        entry, length = self.lookup(prompt, prefer=slot)
        self.vacate(cache, slot, length if entry is not None and entry.slot == slot else 0, room)
        entry, length = self.lookup(prompt, prefer=slot)  # vacating may have moved or evicted what was found
        if entry is None:
            cache.keep(slot, 0)
        elif entry.slot == slot:
            cache.keep(slot, length)
        elif entry.slot is None:
            cache.write(slot, entry.blocks, length)
        else:  # another slot's: only this thread re-lets slots or hands their pages back, so it holds still
            cache.copy(entry.slot, slot, length)
        return length

    # --- copies, for other workers ------------------------------------------------------------
    def export(self, tokens: list[int]) -> tuple[int, list[np.ndarray]]:
        """How many leading tokens an entry holds (block-aligned, all of them if it can) and a copy of them."""
        if not self.on:
            return 0, []
        keys = block_keys(tokens, len(tokens))
        with self.lock:
            entry, length = self._longest(tokens, keys, None)
            if entry is None:
                return 0, []
            if entry.slot is None:
                return length, [block[:, :length] for block in entry.blocks]
            assert self.slots is not None, "a resident entry without the slots that hold it"
            return length, self.slots.read(entry.slot, length)

    def adopt(self, tokens: list[int], blocks: list[np.ndarray], nbytes: int) -> None:
        """Keep `blocks` (each holding the positions of the whole blocks of `tokens`, `nbytes` in all) as a copied
        entry, unless one already holds them all."""
        keys = block_keys(tokens, len(tokens))
        if not keys or nbytes > self.capacity:
            return
        length = len(keys) * BLOCK
        with self.lock:
            if self._longest(tokens, keys, None)[1] == length:
                return
            while self.bytes + nbytes > self.capacity and self._evict_copied():
                pass
            self._add(tuple(tokens[:length]), keys, Entry(tuple(tokens[:length]), blocks, nbytes))
            self.bytes += nbytes

    # --- the index ----------------------------------------------------------------------------
    def _add(self, tokens: tuple[int, ...], keys: list[int], entry: Entry) -> int:
        ident = next(self._ids)
        self.entries[ident] = entry
        first = next((j for j, key in enumerate(keys) if not self.index.get(key)), len(keys))
        if self.journal is not None and first < len(keys):
            self.journal.append(("stored", tokens[first * BLOCK:], tuple(keys[first:]),
                                 keys[first - 1] if first else None))
        for key in keys:
            self.index.setdefault(key, []).append(ident)
        return ident

    def _drop(self, ident: int) -> Entry:
        entry = self.entries.pop(ident)
        self.bytes -= entry.nbytes
        gone = []
        for key in block_keys(entry.tokens, len(entry.tokens)):
            holders = self.index.get(key, [])
            if ident in holders:
                holders.remove(ident)
                if not holders:
                    del self.index[key]
                    gone.append(key)
        if self.journal is not None and gone:
            self.journal.append(("removed", (), tuple(gone), None))
        return entry

    def _evict_copied(self) -> bool:
        ident = next((i for i, entry in self.entries.items() if entry.slot is None), None)
        if ident is None:
            return False
        self._drop(ident)
        return True

    def evict_oldest(self, frees: Callable[[Entry], bool]) -> Entry | None:
        """Drop the least recently used entry whose going frees memory (`frees` says which do: the KV pool wants
        blocks), and return it; None when there is none."""
        with self.lock:
            ident = next((i for i, entry in self.entries.items() if frees(entry)), None)
            if ident is None:
                return None
            slot = self.entries[ident].slot
            if slot is not None:
                del self.resident[slot]
            return self._drop(ident)
