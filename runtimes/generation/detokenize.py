"""Incremental detokenization: text deltas as tokens arrive, never a half UTF-8 character."""

from __future__ import annotations

from tokenizers import Tokenizer


class Detokenizer:
    """Decodes a growing list of ids; `push` returns only the new text (vLLM's offset scheme)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # decode from here, so merges with earlier tokens render right
        self.read = 0  # text up to here was already returned
        self.text = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an incomplete character, or a token that renders as nothing yet
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back once the sequence ends."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += delta
        return delta
