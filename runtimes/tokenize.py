"""Tokenization with the model's own tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

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


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        try:
            self._plain = Tokenizer.from_file(str(path))
            self._cut_end = Tokenizer.from_file(str(path))
            self._cut_start = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise BundleError(f"cannot load tokenizer {path}: {exc}") from exc
        for tok in (self._plain, self._cut_end, self._cut_start):
            tok.no_padding()
            tok.no_truncation()
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
