"""Tokenization with the model's own tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenizers import Encoding, Tokenizer

from runtimes.bundle import BundleError, EngineConfig
from runtimes.bundle.engine import RerankPrompt

Truncate = Literal["NONE", "START", "END"]
# Below this many characters a request tokenizes on the event loop: a hop to a worker thread and back
# costs more than the tokenizing (tens of microseconds for a sentence); longer inputs go to a thread.
INLINE_CHARS = 4096


class InputTooLong(ValueError):
    def __init__(self, index: int, tokens: int, limit: int) -> None:
        super().__init__(f"input {index} has {tokens} tokens; this model takes at most {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


def load_tokenizer(path: Path) -> Tokenizer:
    """tokenizer.json, untruncated and unpadded; a file it cannot read is a BundleError."""
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise BundleError(f"cannot load tokenizer {path}: {exc}") from exc
    tok.no_padding()
    tok.no_truncation()
    return tok


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        self._plain, self._cut_end, self._cut_start = load_tokenizer(path), load_tokenizer(path), load_tokenizer(path)
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


@dataclass(frozen=True)
class Pair:
    """A query and a passage tokenized as one sequence, as a cross-encoder reads them."""

    ids: list[int]
    types: list[int]  # 0 for the query's tokens, 1 for the passage's where the tokenizer's pair template says so

    def __len__(self) -> int:
        return len(self.ids)


class PairTokenizer:
    """(query, passage) pairs through the tokenizer's own pair template; an over-long pair is cut longest first,
    as transformers' tokenizers cut for sentence-transformers' CrossEncoder (the gate's reference).

    With a decoder reranker's prompt (Qwen3-Reranker's recipe), a pair is one text instead: the prompt's prefix
    tokens, the filled template's tokens (cut at the end when over-long, as the model card cuts them) and the
    suffix tokens, all of type 0."""

    def __init__(self, path: Path, max_length: int, prompt: RerankPrompt | None = None) -> None:
        self._plain, self._cut = load_tokenizer(path), load_tokenizer(path)
        self.max_length = max_length
        self.vocab_size = self._plain.get_vocab_size(with_added_tokens=True)
        self._prompt = prompt
        self._specials = self._plain.num_special_tokens_to_add(is_pair=True)
        if prompt is None:
            self._cut.enable_truncation(max_length, strategy="longest_first")
            return
        self._prefix = self._plain.encode(prompt.prefix, add_special_tokens=False).ids
        self._suffix = self._plain.encode(prompt.suffix, add_special_tokens=False).ids
        budget = max_length - len(self._prefix) - len(self._suffix)
        if budget < 1:
            raise BundleError(f"the reranker's prompt takes {max_length - budget} tokens, and a pair may hold "
                              f"{max_length}: rebuild it with a profile of a longer context")
        self._cut.enable_truncation(budget, direction="right")

    @classmethod
    def of_engine(cls, model_dir: Path, config: EngineConfig) -> PairTokenizer:
        """The pair tokenizer a reranker's engine was gated with and is served with."""
        return cls(model_dir / config.tokenizer_file, config.max_seq_length, config.reranker.prompt)

    def encode(self, pairs: list[tuple[str, str]], truncate: Truncate = "NONE") -> list[Pair]:
        """Each (query, passage) as one sequence; over-long pairs raise InputTooLong (the pair's index) unless
        truncated."""
        if self._prompt is not None:
            return self._encode_prompted(pairs, self._prompt, truncate)
        # What tokenizers' encode(query, passage) does, with each query tokenized once instead of once a pair (an
        # 8,192-character query against 2,048 passages was 16M characters to tokenize twice, and each over-long
        # pair's cut kept its query's every token as overflow): the two sequences alone, then the pair template
        # and the cut (post_process). Longest-first cuts by the two lengths, compared with each other and with the
        # budget only, so a query cut to max_length + 1 tokens ends the same beside a passage of max_length or
        # fewer; beside a longer passage the query goes whole.
        queries = {query: self._query(query) for query in dict.fromkeys(query for query, _ in pairs)}
        passages = self._plain.encode_batch([passage for _, passage in pairs], add_special_tokens=False)
        out = []
        for index, ((query, _), passage) in enumerate(zip(pairs, passages, strict=True)):
            whole, cut = queries[query]
            tokens = len(whole) + len(passage) + self._specials
            if tokens > self.max_length and truncate == "NONE":
                raise InputTooLong(index, tokens, self.max_length)
            pair = self._cut.post_process(cut if len(passage) <= self.max_length else whole, passage)
            out.append(Pair(pair.ids, pair.type_ids))
        return out

    def _query(self, query: str) -> tuple[Encoding, Encoding]:
        """A query's tokens, whole and cut to max_length + 1."""
        whole, cut = (self._plain.encode(query, add_special_tokens=False) for _ in range(2))
        cut.truncate(self.max_length + 1)
        return whole, cut

    def _encode_prompted(self, pairs: list[tuple[str, str]], prompt: RerankPrompt, truncate: Truncate) -> list[Pair]:
        texts = [prompt.text(query, passage) for query, passage in pairs]
        frame = len(self._prefix) + len(self._suffix)
        out = []
        for index, body in enumerate(e.ids for e in self._plain.encode_batch(texts)):
            if len(body) + frame > self.max_length:
                if truncate == "NONE":
                    raise InputTooLong(index, len(body) + frame, self.max_length)
                body = self._cut.encode(texts[index]).ids
            ids = [*self._prefix, *body, *self._suffix]
            out.append(Pair(ids, [0] * len(ids)))
        return out
