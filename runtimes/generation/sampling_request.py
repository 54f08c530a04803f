"""One check of a generation request's sampling fields, whichever front door it came through.

The OpenAI routes (runtimes/api) and Dynamo's worker (runtimes/dynamo/requests.py) each map their wire shape onto
SamplingRequest and turn InvalidSampling into their own error reply (a 400; Dynamo's InvalidArgument), so a bound
that one door keeps, the other keeps too; a field one door's shape lacks is simply not sent. The OpenAI schema
takes its numbers from BOUNDS, so its documented limits are these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtimes.generation.guided import MAX_CHOICES, Grammar, Grammars, GuideError, GuideSpec
from runtimes.generation.sampling import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS, SamplingParams

MAX_TOKENS = 1 << 20
MAX_STOP = 8
MAX_STOP_CHARS = 256
MAX_LOGPROBS = 20  # alternatives a token may ask for
MAX_GRAMMAR = 16384  # characters of a regex or a Lark grammar
MAX_CHOICE_CHARS = 256
INT64 = 1 << 63


class InvalidSampling(ValueError):
    """A field out of its type or bounds; the message names it as the request spelled it."""

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Bound:
    low: int | float
    high: int | float
    integer: bool = False
    above: bool = False  # low itself is out: a top_p of 0 would keep no token

    def holds(self, value: int | float) -> bool:
        return (self.low < value if self.above else self.low <= value) and value <= self.high

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} above {self.low:g} and at most {self.high:g}" if self.above \
            else f"{kind} in {self.low}..{self.high}" if self.integer else f"{kind} in {self.low:g}..{self.high:g}"


BOUNDS = {
    "max_tokens": Bound(1, MAX_TOKENS, integer=True),
    "min_tokens": Bound(0, MAX_TOKENS, integer=True),
    "temperature": Bound(0, 2),
    "top_p": Bound(0, 1, above=True),
    "top_k": Bound(-1, MAX_TOKENS, integer=True),  # -1 (vLLM) or 0: no limit
    "seed": Bound(-INT64, 2 * INT64 - 1, integer=True),  # any 64-bit seed, signed or not
    "repetition_penalty": Bound(0.01, 10),
    "presence_penalty": Bound(-2, 2),
    "frequency_penalty": Bound(-2, 2),
    "logprobs": Bound(0, MAX_LOGPROBS, integer=True),
    "prompt_logprobs": Bound(0, MAX_LOGPROBS, integer=True),
}
TOKEN_ID = Bound(0, INT64 - 1, integer=True)
BIAS = Bound(-100, 100)  # OpenAI's range for a logit_bias value


@dataclass(frozen=True)
class SamplingRequest:
    """A request's sampling fields as its front door received them; None: not sent, the default applies. The types
    are what a field should hold, not a promise: a door passes JSON as it came and checked() tests each value."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    logit_bias: Mapping[str, float] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool | None = None
    speculative: bool | None = None
    names: Mapping[str, str] = field(default_factory=dict)  # a field's name as the door's clients spell it

    def name(self, key: str) -> str:
        return self.names.get(key, key)


@dataclass(frozen=True)
class Sampling:
    """A request's sampling fields, every one checked; fit() makes them one prompt's SamplingParams."""

    base: SamplingParams  # max_tokens: what was asked, 0 for the room the prompt leaves (fit() sets it)
    request: SamplingRequest  # for the names its fields go by

    def serving(self, grammar: Grammar | None, keep: frozenset[int] = frozenset()) -> Sampling:
        """With what the server adds: the compiled constraint, the special tokens the reply's readers need."""
        return replace(self, base=replace(self.base, grammar=grammar, keep_special_tokens=keep))

    def fit(self, context: int, prompt: int, index: int | None = None, choice: int = 0) -> SamplingParams:
        """One prompt's parameters (index: which prompt, for the message); choice: which of n, each its own seed."""
        most, least = self._room(context, prompt, index), self.base.min_tokens
        if least > most:
            raise InvalidSampling(f"{self.request.name('min_tokens')} ({least}) exceeds "
                                  f"{self.request.name('max_tokens')} ({most})")
        # n choices of one seeded request differ from each other and repeat run to run, as in vLLM
        seed = None if self.base.seed is None else self.base.seed + choice
        return replace(self.base, max_tokens=most, seed=seed)

    def _room(self, context: int, prompt: int, index: int | None) -> int:
        asked = self.base.max_tokens
        wanted = prompt + (asked or 1)
        if wanted <= context:
            return asked or context - prompt
        which = "" if index is None else f" (prompt {index})"
        advice = f"The prompt's {prompt} tokens fill the context of {context}: shorten the prompt." \
            if prompt >= context else f"Shorten the prompt or lower {self.request.name('max_tokens')}."
        raise InvalidSampling(f"This model's maximum context length is {context} tokens. However, you requested "
                              f"{wanted} tokens{which} ({prompt} in the prompt, {asked or 1} in the completion). "
                              + advice, "context_length_exceeded")


def _checked_as(request: SamplingRequest, key: str) -> tuple[Any, str]:
    """A field's value as sent and its name as the door spells it."""
    return getattr(request, key), request.name(key)


def _number(value: Any, name: str, bound: Bound) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (isinstance(value, float) and not math.isfinite(value)) \
            or (bound.integer and not isinstance(value, int)) or not bound.holds(value):
        raise InvalidSampling(f"{name} must be {bound}")
    return value


def _float(request: SamplingRequest, key: str, default: float) -> float:
    value, name = _checked_as(request, key)
    return default if value is None else float(_number(value, name, BOUNDS[key]))


def _int(request: SamplingRequest, key: str) -> int | None:
    value, name = _checked_as(request, key)
    return None if value is None else int(_number(value, name, BOUNDS[key]))


def _flag(request: SamplingRequest, key: str, default: bool) -> bool:
    value, name = _checked_as(request, key)
    if value is not None and not isinstance(value, bool):
        raise InvalidSampling(f"{name} must be true or false")
    return default if value is None else value


def _stops(request: SamplingRequest) -> tuple[str, ...]:
    value, name = _checked_as(request, "stop")
    texts = [value] if isinstance(value, str) else [] if value is None else value
    if not isinstance(texts, list | tuple) or any(not isinstance(s, str) for s in texts):
        raise InvalidSampling(f"{name} must be a string or a list of strings")
    if len(texts) > MAX_STOP:
        raise InvalidSampling(f"{name} holds {len(texts)} stop sequences; at most {MAX_STOP}")
    if any(len(s) > MAX_STOP_CHARS for s in texts):
        raise InvalidSampling(f"{name}: a stop sequence has at most {MAX_STOP_CHARS} characters")
    return tuple(s for s in texts if s)


def _stop_ids(request: SamplingRequest) -> frozenset[int]:
    ids, name = _checked_as(request, "stop_token_ids")
    ids = [] if ids is None else ids
    if not isinstance(ids, list | tuple) or len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidSampling(f"{name} must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
    return frozenset(int(_number(t, f"{name}[{i}]", TOKEN_ID)) for i, t in enumerate(ids))


def _bias(request: SamplingRequest) -> tuple[tuple[int, float], ...]:
    bias, name = _checked_as(request, "logit_bias")
    bias = {} if bias is None else bias
    if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
        raise InvalidSampling(f"{name} must be an object of at most {MAX_LOGIT_BIAS} entries")
    for key in bias:
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 19):
            raise InvalidSampling(f"{name}: keys are token ids as strings, not {str(key)[:20]!r}")
    return tuple((int(k), float(_number(v, f"{name}[{k}]", BIAS))) for k, v in bias.items())


def checked(request: SamplingRequest) -> Sampling:
    """Every field's type and bounds, or InvalidSampling naming the first that is wrong."""
    return Sampling(SamplingParams(
        max_tokens=_int(request, "max_tokens") or 0, temperature=_float(request, "temperature", 1.0),
        top_p=_float(request, "top_p", 1.0), top_k=max(_int(request, "top_k") or 0, 0),
        seed=_int(request, "seed"), repetition_penalty=_float(request, "repetition_penalty", 1.0),
        presence_penalty=_float(request, "presence_penalty", 0.0),
        frequency_penalty=_float(request, "frequency_penalty", 0.0), stop=_stops(request),
        stop_token_ids=_stop_ids(request), ignore_eos=_flag(request, "ignore_eos", False),
        min_tokens=_int(request, "min_tokens") or 0, logit_bias=_bias(request),
        logprobs=_int(request, "logprobs"), prompt_logprobs=_int(request, "prompt_logprobs"),
        skip_special_tokens=_flag(request, "skip_special_tokens", True),
        speculative=_flag(request, "speculative", True)), request)


def exactly(tokens: int) -> SamplingParams:
    """Greedy, and exactly `tokens` new tokens: what the build's gate and the in-process benchmark ask, through the
    same check as any request."""
    return checked(SamplingRequest(max_tokens=tokens, temperature=0.0, min_tokens=tokens)).base


def check_guide(name: str, spec: GuideSpec) -> GuideSpec:
    """An output constraint's own bounds (a JSON schema sent as text parsed); InvalidSampling naming the field."""
    value = spec.value
    if spec.kind == "json_schema" and isinstance(value, str):
        try:
            return GuideSpec("json_schema", json.loads(value))
        except ValueError as exc:
            raise InvalidSampling(f"'{name}' is not JSON: {exc}", "invalid_guided_json") from exc
    if spec.kind in ("regex", "lark") and not (isinstance(value, str) and len(value) <= MAX_GRAMMAR):
        raise InvalidSampling(f"'{name}' must be a text of at most {MAX_GRAMMAR} characters")
    if spec.kind == "choice" and not (isinstance(value, list) and 1 <= len(value) <= MAX_CHOICES and all(
            isinstance(c, str) and 1 <= len(c) <= MAX_CHOICE_CHARS for c in value)):
        raise InvalidSampling(f"'{name}' must be a list of 1 to {MAX_CHOICES} texts of 1 to {MAX_CHOICE_CHARS} "
                              "characters")
    return spec


def compile_guide(grammars: Grammars, name: str, spec: GuideSpec | str) -> Grammar:
    """The compiled constraint, or InvalidSampling naming the field. Takes milliseconds: call it off the loop."""
    try:
        return grammars.compile(spec)
    except (GuideError, RecursionError) as exc:  # a schema nested past Python's stack is the request's fault too
        raise InvalidSampling(f"'{name}' cannot be compiled: {exc}", "invalid_constraint") from exc
