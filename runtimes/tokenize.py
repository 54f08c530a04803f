"""Tokenization with the model's own tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
from tokenizers import Tokenizer

from runtimes.bundle import BundleError

Truncate = Literal["NONE", "START", "END"]
# Below this many characters a request tokenizes on the event loop: a hop to a worker thread and back
# costs more than the tokenizing (tens of microseconds for a sentence); longer inputs go to a thread.
INLINE_CHARS = 4096


class InputTooLong(ValueError):
    def __init__(self, index: int, tokens: int, limit: int) -> None:
        super().__init__(f"input {index} has {tokens} tokens; this model takes at most {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


def _load(path: Path) -> Tokenizer:
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise BundleError(f"cannot load tokenizer {path}: {exc}") from exc
    tok.no_padding()
    tok.no_truncation()
    return tok


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        self._plain, self._cut_end, self._cut_start = _load(path), _load(path), _load(path)
        self._cut_end.enable_truncation(max_length, direction="right")
        self._cut_start.enable_truncation(max_length, direction="left")
        self.max_length = max_length
        self.vocab_size = self._plain.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str], truncate: Truncate = "NONE") -> list[list[int]]:
        """Token ids per text, special tokens included; over-long texts raise unless truncation is asked."""
        encoded = [e.ids for e in self._plain.encode_batch(texts)]
        for index, ids in enumerate(encoded):
            if len(ids) <= self.max_length:
                continue
            if truncate == "NONE":
                raise InputTooLong(index, len(ids), self.max_length)
            cutter = self._cut_end if truncate == "END" else self._cut_start
            encoded[index] = cutter.encode(texts[index]).ids
        return encoded

    async def encode_async(self, texts: list[str], truncate: Truncate = "NONE") -> list[list[int]]:
        if sum(len(t) for t in texts) <= INLINE_CHARS:
            return self.encode(texts, truncate)
        return await anyio.to_thread.run_sync(self.encode, texts, truncate)


@dataclass(frozen=True)
class Pair:
    """A query and a passage tokenized as one sequence, as a cross-encoder reads them."""

    ids: list[int]
    types: list[int]  # 0 for the query's tokens, 1 for the passage's where the tokenizer's pair template says so

    def __len__(self) -> int:
        return len(self.ids)


class PairTokenizer:
    """(query, passage) pairs through the tokenizer's own pair template; an over-long pair is cut longest first,
    as transformers' tokenizers cut for sentence-transformers' CrossEncoder (the gate's reference)."""

    def __init__(self, path: Path, max_length: int) -> None:
        self._plain, self._cut = _load(path), _load(path)
        self._cut.enable_truncation(max_length, strategy="longest_first")
        self.max_length = max_length
        self.vocab_size = self._plain.get_vocab_size(with_added_tokens=True)

    def encode(self, pairs: list[tuple[str, str]], truncate: Truncate = "NONE") -> list[Pair]:
        """Each (query, passage) as one sequence; over-long pairs raise InputTooLong (the pair's index) unless
        truncated."""
        encoded = self._plain.encode_batch(pairs)
        for index, pair in enumerate(encoded):
            if len(pair.ids) <= self.max_length:
                continue
            if truncate == "NONE":
                raise InputTooLong(index, len(pair.ids), self.max_length)
            encoded[index] = self._cut.encode(*pairs[index])
        return [Pair(pair.ids, pair.type_ids) for pair in encoded]

    async def encode_async(self, pairs: list[tuple[str, str]], truncate: Truncate = "NONE") -> list[Pair]:
        if sum(len(q) + len(p) for q, p in pairs) <= INLINE_CHARS:
            return self.encode(pairs, truncate)
        return await anyio.to_thread.run_sync(self.encode, pairs, truncate)
