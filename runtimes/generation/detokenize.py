"""Incremental detokenization: text deltas as tokens arrive, never a half UTF-8 character."""

from __future__ import annotations

from tokenizers import Tokenizer

# Prompt tokens decoded before the first new one (as vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
CONTEXT_TOKENS = 6


def special_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids decode(skip_special_tokens=True) leaves out."""
    return frozenset(i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special)


class Detokenizer:
    """Decodes a growing list of ids; `push` returns only the new text (vLLM's offset scheme).

    The first new tokens are decoded after the prompt's last few: a SentencePiece decoder drops the space
    that opens a sequence, so " Paris" decoded alone would come back as "Paris".

    keep: special tokens that stay in the text while the others are skipped (a chat's think and tool-call
    markers, which its readers read; <|im_end|> and the like must not reach the reply)."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int] | None = None, skip_special: bool = True,
                 keep: frozenset[int] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.drop = special_ids(tokenizer) - keep if skip_special and keep else frozenset()
        self.skip = skip_special and not self.drop  # with a drop set, that set is what is skipped
        self.ids: list[int] = list((prompt or [])[-CONTEXT_TOKENS:])
        self.prefix = 0  # decode from here, so merges with earlier tokens render right
        self.read = len(self.ids)  # text up to here was already returned (or is the prompt's)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        if self.drop:
            ids = [i for i in ids if i not in self.drop]
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip))

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an incomplete character, or a token that renders as nothing yet
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back once the sequence ends."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        delta = after[len(before):] if after.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += delta
        return delta
