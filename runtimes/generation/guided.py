"""Constrained decoding: a grammar (a JSON schema, a regex, a choice, a Lark grammar) applied as a token mask
in the sampler, one matcher per sequence, inside continuous batching.

The grammar engine is llguidance (the one vLLM, llama.cpp and onnxruntime-genai use). Measured on this
project's 2-core CPU with a 128k-token vocabulary: a mask costs 19 us at the median, 122 us at p90, and the
library needs neither PyTorch nor a GPU.
"""

from __future__ import annotations

import collections
import ctypes
import json
import threading
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import llguidance.numpy
import numpy as np
from tokenizers import Tokenizer

GuideKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]
MAX_CHOICES = 256
CACHED_GRAMMARS = 32  # compiled grammars kept, least recently used dropped first
# Compact JSON (no free whitespace): what OpenAI's structured outputs give, and a model cannot pad the output
# with whitespace until max_tokens cuts it into an invalid document.
_JSON_OPTIONS: Any = {"whitespace_flexible": False}
_LIBC = ctypes.CDLL(None)  # the process's own C library (glibc in the image)
PROBE_STEPS = 4  # tokens of one path a grammar is followed along when it is compiled
# llguidance's words for a schema it refuses, where they name its own options, said as what the request can do.
_IN_API_WORDS = {"oneOf constraints are not supported": "'oneOf' is not supported: write it as 'anyOf' (the output "
                                                         "then matches at least one of the options)"}


class GuideError(ValueError):
    """The grammar or schema a request sent cannot be compiled; the message says why."""


@dataclass(frozen=True)
class GuideSpec:
    kind: GuideKind
    value: Any  # the schema (a dict), the regex or Lark text, or the list of choices


def lark_string(text: str) -> str:
    """A Lark string literal (JSON's escapes) that matches `text` exactly."""
    return json.dumps(text, ensure_ascii=False)


def grammar_text(spec: GuideSpec) -> str:
    """The llguidance grammar for a request's constraint."""
    if spec.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.value, overrides=_JSON_OPTIONS)
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(lark_string(c) for c in spec.value))
    return llguidance.LLMatcher.grammar_from_lark(spec.value)


def _in_api_words(reason: str) -> str:
    return next((words for found, words in _IN_API_WORDS.items() if found in reason), reason)


def _return_freed_memory() -> None:
    """A refused grammar's lexer can take tens of MB before it gives out at its bounds. llguidance frees them, but
    glibc keeps the pages in its arenas, so the server's memory reads as grown by each hostile constraint (measured
    on the tiny Llama: 398 -> 460 MB over 60 refusals, back to 398 after a trim). Hand them back to the system;
    nothing to do where the C library has no malloc_trim."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


class Grammars:
    """One model's grammar compiler: its vocabulary as llguidance sees it, built once."""

    def __init__(self, tokenizer: Tokenizer, vocab: int, eos_ids: tuple[int, ...]) -> None:
        self.vocab, self.source, self.eos_ids = vocab, tokenizer, eos_ids
        self._tokenizer: llguidance.LLTokenizer | None = None
        # Errors name the grammar's fault, never the parser's internal state. The lexer's fuel bounds the work a
        # mask may take (measured here: a hostile regex's first mask took 0.9 s at the library's defaults, which
        # would stall every stream of the batch; 0.12 s with these, and every realistic schema still compiles).
        # Lexer states bound a grammar's memory (1-2 kB each), kept CACHED_GRAMMARS times at most.
        self.limits = llguidance.LLParserLimits(verbose_errors=False, initial_lexer_fuel=200_000,
                                                step_lexer_fuel=50_000, max_lexer_states=50_000)
        self.compiled: collections.OrderedDict[str, Grammar] = collections.OrderedDict()
        self.lock = threading.Lock()  # compiles run in the event loop's worker threads

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """The vocabulary as llguidance reads it, made at the first constrained request (about a second for 128k
        tokens), so a model whose tokenizer it cannot read still serves everything else."""
        with self.lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = llguidance.LLTokenizer(self.source.to_str(), n_vocab=self.vocab,
                                                             eos_token=list(self.eos_ids) or None)
                except ValueError as exc:
                    raise GuideError(f"the grammar engine cannot read this model's tokenizer ({exc}), so this "
                                     "model serves no constrained output") from exc
            return self._tokenizer

    def compile(self, spec: GuideSpec | str) -> Grammar:
        """A compiled grammar; GuideError when it is invalid. Can take milliseconds: call it off the event loop.
        Kept by its text (an application sends the same schema request after request, as vLLM's cache assumes)."""
        try:
            text = spec if isinstance(spec, str) else grammar_text(spec)
        except ValueError as exc:
            raise GuideError(_in_api_words(str(exc))) from exc
        with self.lock:
            if text in self.compiled:
                self.compiled.move_to_end(text)
                return self.compiled[text]
        grammar = self._compile(text, self.tokenizer)
        with self.lock:
            self.compiled[text] = grammar
            while len(self.compiled) > CACHED_GRAMMARS:
                self.compiled.popitem(last=False)
        return grammar

    def _compile(self, text: str, tokenizer: llguidance.LLTokenizer) -> Grammar:
        compiled = self._try_compile(text, tokenizer)
        if isinstance(compiled, str):
            _return_freed_memory()  # the refused matcher went with _try_compile's frame
            raise GuideError(compiled)
        return compiled

    def _try_compile(self, text: str, tokenizer: llguidance.LLTokenizer) -> Grammar | str:
        """The grammar, or why it is refused (a string, not an exception, so nothing keeps its matcher alive)."""
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0, limits=self.limits)
        if not matcher.is_error():
            Guide(matcher, self.vocab).allowed()  # the first mask builds the lexer: here, not in the batch's step
        if matcher.is_error():
            reason = matcher.get_error().strip().splitlines()[0][:500]
            return "it matches no output at all" if reason == "NoExtensionBias" else _in_api_words(reason)
        reason = self._probe(matcher)
        if reason:
            return (f"it is too costly to follow ({reason}); simplify the output constraint: fewer nested or counted "
                    "repetitions")
        return Grammar(matcher, self.vocab)

    def _probe(self, matcher: llguidance.LLMatcher) -> str:
        """Why following the grammar fails along one path of PROBE_STEPS tokens (the lowest id allowed each step: a
        byte, in a byte-level vocabulary), on a copy; "" when it does not. Nested counted groups (a{1000}{1000},
        40 nested (...){2}) compile, then blow the lexer's bounds at their first byte: found here, that is a 400
        before the request is admitted, not a stream that fails."""
        guide = Guide(matcher.deep_copy(), self.vocab)
        for _ in range(PROBE_STEPS):
            allowed = guide.allowed()
            allowed[[t for t in self.eos_ids if t < self.vocab]] = False
            tokens = np.flatnonzero(allowed)
            if guide.matcher.is_error() or not len(tokens) or not guide.matcher.consume_token(int(tokens[0])):
                break
        return guide.matcher.get_error().strip().splitlines()[0][:200] if guide.matcher.is_error() else ""


class Grammar:
    """A compiled constraint; each sequence that follows it gets its own copy of the matcher."""

    def __init__(self, prototype: llguidance.LLMatcher, vocab: int) -> None:
        self.prototype, self.vocab = prototype, vocab

    def guide(self) -> Guide:
        return Guide(self.prototype.deep_copy(), self.vocab)


class Guide:
    """One sequence's place in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int) -> None:
        self.matcher, self.vocab = matcher, vocab
        self.bits = llguidance.numpy.allocate_token_bitmask(1, vocab)

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next, as a boolean row over the vocabulary."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self.bits)
        return np.unpackbits(self.bits[0].view(np.uint8), bitorder="little")[: self.vocab].astype(bool)

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            reason = self.matcher.get_error().strip().splitlines()[0][:200]
            raise GuideError(f"the grammar could not go on at token {token}: {reason}")

    @property
    def finished(self) -> bool:
        """Nothing more can follow: the output is complete."""
        return bool(self.matcher.is_stopped())
