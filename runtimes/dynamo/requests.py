"""Dynamo's preprocessed request (its `sampling_options`, `stop_conditions`, `output_options`, vLLM's names) as the
scheduler's SamplingParams, and the scheduler's events as Dynamo's response chunks.

Every field is honoured or refused: a field mbuild does not do (n > 1, min_p, a structural tag, ...) is a
Refused with the field's name, which the worker ends the request with; nothing is dropped silently. Stop strings
are Dynamo's own (its postprocessor matches them on text), so they are not the scheduler's. Plain data, no Dynamo
import: tested without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from runtimes.generation.guided import GuideSpec
from runtimes.generation.harmony import detect_harmony
from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.reasoning import detect_reasoning
from runtimes.generation.requests import Event
from runtimes.generation.sampling import MAX_STOP_TOKEN_IDS, SamplingParams
from runtimes.generation.tools import chosen_format

MAX_LOGPROBS = 20  # alternatives a token may ask for, as the HTTP API allows
# What each group may carry, and what mbuild does with it; a key outside these is refused.
SAMPLING = {"temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "guided_decoding", "n", "best_of", "min_p", "use_beam_search", "length_penalty",
            "include_stop_str_in_output"}
STOPS = {"max_tokens", "stop", "stop_token_ids", "stop_token_ids_hidden", "min_tokens", "ignore_eos",
         "max_thinking_tokens"}
OUTPUTS = {"logprobs", "prompt_logprobs", "skip_special_tokens", "formatted_prompt"}
NEUTRAL: dict[str, Any] = {"n": 1, "best_of": 1, "min_p": 0.0, "use_beam_search": False, "length_penalty": 1.0,
                           "include_stop_str_in_output": False, "max_thinking_tokens": None,
                           "formatted_prompt": None, "prompt_logprobs": None}


# mbuild's tool formats (runtimes/generation/tools.py) by Dynamo's parser names: the frontend parses tool calls and
# reasoning out of the text it detokenizes. Dynamo 1.6.1 has no parser for granite's format.
TOOL_PARSERS = {"llama3_json": "llama3_json", "hermes": "hermes", "mistral": "mistral", "phi4_mini": "phi4"}


def parsers(template: str | None, tool_parser: str) -> tuple[str | None, str | None]:
    """(tool-call parser, reasoning parser) for Dynamo's frontend, as mbuild's own server would read the replies of
    a model with this chat template; tool_parser is MBUILD_TOOL_CALL_PARSER's value."""
    if template and detect_harmony(template):
        return "harmony", "gpt_oss"
    tools = chosen_format(tool_parser, template)
    return (TOOL_PARSERS.get(tools.name) if tools else None,
            "basic" if template and detect_reasoning(template) else None)


class Refused(ValueError):
    """A request field mbuild cannot honour; its message names the field."""


def _set(group: dict[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """The group's fields that say something (an empty list or None asks for nothing); unknown ones refused."""
    if not isinstance(group, dict):
        raise Refused(f"{name} must be an object")
    group = {k: v for k, v in group.items() if v is not None and v != [] and v != {}}
    unknown = sorted(set(group) - allowed)
    if unknown:
        raise Refused(f"{name}.{unknown[0]} is not supported by this server")
    for key, value in group.items():
        if key in NEUTRAL and value is not None and value != NEUTRAL[key]:
            raise Refused(f"{name}.{key}={value!r} is not supported by this server (only {NEUTRAL[key]!r})")
    return group


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise Refused(f"{name} must be a number in {low:g}..{high:g}")
    return float(value)


def _integer(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{name} must be an integer in {low}..{high}")
    return value


def guide_of(sampling: dict[str, Any]) -> GuideSpec | None:
    """guided_decoding's one constraint (json, regex, choice or grammar), as the HTTP API's guided_* fields."""
    guided = sampling.get("guided_decoding")
    if guided is None:
        return None
    if not isinstance(guided, dict):
        raise Refused("sampling_options.guided_decoding must be an object")
    given = {k: v for k, v in guided.items() if v is not None and k != "whitespace_pattern"}
    kinds = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark"}
    if len(given) != 1 or next(iter(given)) not in kinds:
        raise Refused("sampling_options.guided_decoding takes exactly one of json, regex, choice, grammar")
    key, value = next(iter(given.items()))
    return GuideSpec(kinds[key], value)  # type: ignore[arg-type]


def sampling_params(request: dict[str, Any], context: int, prompt: int) -> SamplingParams:
    """The scheduler's parameters for a request of `prompt` tokens on a `context`-token engine (no grammar yet: the
    worker compiles guide_of's constraint)."""
    sampling = _set(request.get("sampling_options") or {}, "sampling_options", SAMPLING)
    stops = _set(request.get("stop_conditions") or {}, "stop_conditions", STOPS)
    outputs = _set(request.get("output_options") or {}, "output_options", OUTPUTS)
    room = context - prompt
    if room < 1:
        raise Refused(f"the prompt's {prompt} tokens fill the context of {context}")
    hidden = [*stops.get("stop_token_ids", []), *stops.get("stop_token_ids_hidden", [])]
    if len(hidden) > MAX_STOP_TOKEN_IDS or any(isinstance(t, bool) or not isinstance(t, int) for t in hidden):
        raise Refused(f"stop_conditions.stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} token ids")
    logprobs = outputs.get("logprobs")
    most = _integer(stops.get("max_tokens", room), "stop_conditions.max_tokens", 1, room)
    least = _integer(stops.get("min_tokens", 0), "stop_conditions.min_tokens", 0, room)
    if least > most:  # as the HTTP server refuses it
        raise Refused(f"stop_conditions.min_tokens ({least}) exceeds stop_conditions.max_tokens ({most})")
    return SamplingParams(
        max_tokens=most,
        temperature=_number(sampling.get("temperature", 1.0), "sampling_options.temperature", 0, 2),
        top_p=_number(sampling.get("top_p", 1.0), "sampling_options.top_p", 0, 1),
        top_k=max(0, _integer(sampling.get("top_k", 0), "sampling_options.top_k", -1, 1 << 20)),
        seed=None if "seed" not in sampling else _integer(sampling["seed"], "sampling_options.seed", 0, (1 << 63) - 1),
        repetition_penalty=_number(sampling.get("repetition_penalty", 1.0), "sampling_options.repetition_penalty",
                                   0.01, 10),
        presence_penalty=_number(sampling.get("presence_penalty", 0.0), "sampling_options.presence_penalty", -2, 2),
        frequency_penalty=_number(sampling.get("frequency_penalty", 0.0), "sampling_options.frequency_penalty",
                                  -2, 2),
        stop_token_ids=frozenset(hidden),
        ignore_eos=bool(stops.get("ignore_eos", False)),
        min_tokens=least,
        logprobs=None if logprobs is None else _integer(logprobs, "output_options.logprobs", 0, MAX_LOGPROBS),
        skip_special_tokens=bool(outputs.get("skip_special_tokens", True)),
    )


def _top(logprob: TokenLogprob, decode: Callable[[int], str]) -> list[dict[str, Any]]:
    """Dynamo's top_logprobs entries for one position: the chosen token first, then the alternatives, ranked."""
    ranked = [(logprob.token, logprob.logprob), *((t, v) for t, v in logprob.top if t != logprob.token)]
    return [{"rank": rank, "token_id": token, "token": decode(token), "logprob": value}
            for rank, (token, value) in enumerate(ranked)]


FINISHES = {"stop": "stop", "length": "length", "cancelled": "cancelled", "error": "error"}


def chunk(event: Event, prompt: int, made: int, decode: Callable[[int], str]) -> dict[str, Any]:
    """One scheduler event as Dynamo's response chunk: its token (and logprobs), or the finish with usage."""
    out: dict[str, Any] = {"token_ids": [] if event.token is None else [event.token], "index": 0}
    if event.logprob is not None:
        out["log_probs"] = [event.logprob.logprob]
        out["top_logprobs"] = [_top(event.logprob, decode)]
    if event.finish is not None:
        out["finish_reason"] = FINISHES[event.finish]
        out["completion_usage"] = {"prompt_tokens": prompt, "completion_tokens": made,
                                   "total_tokens": prompt + made}
    return out
