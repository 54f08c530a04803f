"""Incremental detokenization: text deltas as tokens arrive, never a half UTF-8 character."""

from __future__ import annotations

from tokenizers import Tokenizer

# Prompt tokens decoded before the first new one (as vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
CONTEXT_TOKENS = 6


class Detokenizer:
    """Decodes a growing list of ids; `push` returns only the new text (vLLM's offset scheme).

    The first new tokens are decoded after the prompt's last few: a SentencePiece decoder drops the space
    that opens a sequence, so " Paris" decoded alone would come back as "Paris"."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int] | None = None, skip_special: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special
        self.ids: list[int] = list((prompt or [])[-CONTEXT_TOKENS:])
        self.prefix = 0  # decode from here, so merges with earlier tokens render right
        self.read = len(self.ids)  # text up to here was already returned (or is the prompt's)
        self.text = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an incomplete character, or a token that renders as nothing yet
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back once the sequence ends."""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        delta = after[len(before):] if after.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += delta
        return delta
