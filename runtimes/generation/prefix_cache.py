"""Prefix cache: KV entries of prompts already prefilled, so a prompt that starts the same way skips them.

An entry is a copy of one slot's first k cached positions (k a multiple of BLOCK), taken when a prompt's
prefill ends. A new prompt reuses the longest block-aligned prefix that some entry holds, leaving at least
one token to prefill (its logits start the sequence). Lookups go through a chain hash per block (a block's
key is the hash of the previous key and its tokens), and a hit is confirmed on the tokens themselves, so a
hash collision can cost a miss, never a wrong cache. Memory is bounded in bytes; least recently used
entries go first. With a `journal`, the blocks an entry adds to the index and those an eviction takes out are
recorded as ("stored", their tokens, their keys, the key before them) and ("removed", (), keys, None): what a
Dynamo worker publishes as KV events (runtimes/dynamo/engine.py). A Dynamo prefill worker hands an entry's blocks
to a decode worker (export), which takes them in as its own entry (adopt; runtimes/dynamo/kv_transfer.py); those
run on other threads than the scheduler's, so the index changes under a lock. Entries' blocks are never written
after they are made, so they are read without it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from runtimes.bundle.engine import KV_BLOCK_TOKENS
from runtimes.metrics import Metrics

BLOCK = KV_BLOCK_TOKENS  # the reuse granularity (llama.cpp reuses per token)


class SlotCache(Protocol):
    @property
    def bytes_per_token(self) -> int: ...

    def read(self, row: int, count: int) -> list[np.ndarray]: ...

    def write(self, row: int, blocks: list[np.ndarray], count: int) -> None: ...


@dataclass
class Entry:
    tokens: tuple[int, ...]
    blocks: list[np.ndarray]
    nbytes: int


Journaled = tuple[str, tuple[int, ...], tuple[int, ...], int | None]  # kind, tokens, block keys, parent key


def block_keys(tokens: list[int] | tuple[int, ...], limit: int) -> list[int]:
    """keys[j] identifies tokens[:(j + 1) * BLOCK], for every whole block within the first `limit` tokens."""
    keys, key = [], 0
    for end in range(BLOCK, limit + 1, BLOCK):
        key = hash((key, tuple(tokens[end - BLOCK:end])))
        keys.append(key)
    return keys


class PrefixCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # by their last key, LRU
        self.index: dict[int, int] = {}  # block key -> the key of an entry holding that prefix
        self.bytes = 0
        self.queried = self.reused = 0  # prompt tokens looked up, and of them restored (the hit rate's terms)
        self.journal: collections.deque[Journaled] | None = None  # KV events, for whoever publishes them
        self.lock = threading.Lock()

    def lookup(self, prompt: list[int], limit: int | None = None) -> tuple[Entry | None, int]:
        """The entry and the number of leading prompt tokens it can supply (0: a miss), at most `limit` (default:
        all but the last token, whose logits start the sequence)."""
        if self.capacity <= 0:
            return None, 0
        keys = block_keys(prompt, len(prompt) - 1 if limit is None else limit)
        with self.lock:
            return self._longest(prompt, keys)

    def _longest(self, prompt: list[int], keys: list[int]) -> tuple[Entry | None, int]:
        for j, key in reversed(list(enumerate(keys))):
            owner = self.index.get(key)
            if owner is None:
                continue
            entry, length = self.entries[owner], (j + 1) * BLOCK
            if entry.tokens[:length] == tuple(prompt[:length]):
                self.entries.move_to_end(owner)
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

    def restore(self, cache: SlotCache, row: int, prompt: list[int]) -> int:
        """Fill the slot with the longest cached prefix of the prompt; returns the tokens it now holds."""
        entry, length = self.lookup(prompt)
        if entry is not None:
            cache.write(row, entry.blocks, length)
        return length

    def store(self, cache: SlotCache, row: int, prompt: list[int]) -> None:
        """Keep the slot's block-aligned prompt prefix, unless an entry already holds all of it."""
        keys = block_keys(prompt, len(prompt))
        if not keys or len(keys) * BLOCK * cache.bytes_per_token > self.capacity:
            return
        with self.lock:
            if self._held(prompt, keys):
                return
        self.adopt(prompt, cache.read(row, len(keys) * BLOCK), len(keys) * BLOCK * cache.bytes_per_token)

    def export(self, tokens: list[int]) -> tuple[int, list[np.ndarray]]:
        """How many leading tokens an entry holds (block-aligned, all of them if it can) and their blocks."""
        entry, length = self.lookup(tokens, len(tokens))
        return (length, [block[:, :length] for block in entry.blocks]) if entry is not None else (0, [])

    def adopt(self, tokens: list[int], blocks: list[np.ndarray], nbytes: int) -> None:
        """Keep `blocks` (each holding the positions of the whole blocks of `tokens`, `nbytes` in all) as an entry,
        unless one already holds them all."""
        keys = block_keys(tokens, len(tokens))
        if not keys or nbytes > self.capacity:
            return
        with self.lock:
            if not self._held(tokens, keys):
                self._add(tokens, keys, blocks, nbytes)

    def _held(self, prompt: list[int], keys: list[int]) -> bool:
        owner, length = self.index.get(keys[-1]), len(keys) * BLOCK
        if owner is None or self.entries[owner].tokens[:length] != tuple(prompt[:length]):
            return False
        self.entries.move_to_end(owner)
        return True

    def _add(self, prompt: list[int], keys: list[int], blocks: list[np.ndarray], nbytes: int) -> None:
        length = len(keys) * BLOCK
        while self.bytes + nbytes > self.capacity:
            self._evict()
        entry = Entry(tuple(prompt[:length]), blocks, nbytes)
        self.entries[keys[-1]] = entry
        self.bytes += nbytes
        first = next((j for j, key in enumerate(keys) if key not in self.index), len(keys))
        if self.journal is not None and first < len(keys):
            self.journal.append(("stored", tuple(prompt[first * BLOCK:length]), tuple(keys[first:]),
                                 keys[first - 1] if first else None))
        for key in keys:
            self.index[key] = keys[-1]

    def evict_oldest(self) -> bool:
        """Drop the least recently used entry (the KV pool wants its blocks); False when there is none."""
        with self.lock:
            if not self.entries:
                return False
            self._evict()
            return True

    def _evict(self) -> None:
        key, entry = self.entries.popitem(last=False)
        self.bytes -= entry.nbytes
        gone = [block for block in block_keys(entry.tokens, len(entry.tokens)) if self.index.get(block) == key]
        for block in gone:
            del self.index[block]
        if self.journal is not None and gone:
            self.journal.append(("removed", (), tuple(gone), None))
