"""Dynamo's preprocessed request (its `sampling_options`, `stop_conditions`, `output_options`, vLLM's names) as the
scheduler's SamplingParams, and the scheduler's events as Dynamo's response chunks.

Every field is honoured or refused: a field mbuild does not do (n > 1, min_p, a structural tag, ...) is an
InvalidSampling with the field's name, which the worker ends the request with; nothing is dropped silently. The
values go through the check the HTTP API's go through (runtimes/generation/sampling_request.py), so both doors
refuse the same. Stop strings are checked alike but are Dynamo's own to match (its postprocessor does, on text), so
they are not the scheduler's. Plain data, no Dynamo import: tested without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from runtimes.generation.guided import GuideSpec
from runtimes.generation.harmony import detect_harmony
from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.reasoning import detect_reasoning
from runtimes.generation.requests import Event
from runtimes.generation.sampling import SamplingParams
from runtimes.generation.sampling_request import InvalidSampling, SamplingRequest, check_guide, checked
from runtimes.generation.tools import chosen_format

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
# The shared check's fields by their name in Dynamo's request, for its messages
GROUPS = {"sampling_options": SAMPLING, "stop_conditions": STOPS, "output_options": OUTPUTS}
NAMES = {key: f"{group}.{key}" for group, keys in GROUPS.items() for key in keys}
CHECKED = {f.name for f in fields(SamplingRequest)} - {"stop_token_ids", "names"}  # taken as sent
GUIDED = "sampling_options.guided_decoding"


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


def _set(group: dict[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """The group's fields that say something (an empty list or None asks for nothing); unknown ones refused."""
    if not isinstance(group, dict):
        raise InvalidSampling(f"{name} must be an object")
    group = {k: v for k, v in group.items() if v is not None and v != [] and v != {}}
    unknown = sorted(set(group) - allowed)
    if unknown:
        raise InvalidSampling(f"{name}.{unknown[0]} is not supported by this server")
    for key, value in group.items():
        if key in NEUTRAL and value is not None and value != NEUTRAL[key]:
            raise InvalidSampling(f"{name}.{key}={value!r} is not supported by this server (only {NEUTRAL[key]!r})")
    return group


def guide_of(sampling: dict[str, Any]) -> GuideSpec | None:
    """guided_decoding's one constraint (json, regex, choice or grammar), as the HTTP API's guided_* fields."""
    guided = sampling.get("guided_decoding")
    if guided is None:
        return None
    if not isinstance(guided, dict):
        raise InvalidSampling(f"{GUIDED} must be an object")
    given = {k: v for k, v in guided.items() if v is not None and k != "whitespace_pattern"}
    kinds = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark"}
    if len(given) != 1 or next(iter(given)) not in kinds:
        raise InvalidSampling(f"{GUIDED} takes exactly one of json, regex, choice, grammar")
    key, value = next(iter(given.items()))
    return check_guide(f"{GUIDED}.{key}", GuideSpec(kinds[key], value))  # type: ignore[arg-type]


def _stop_ids(stops: dict[str, Any]) -> Any:
    """Dynamo's visible and hidden stop ids: the scheduler stops at either (Dynamo hides the hidden ones)."""
    visible, hidden = stops.get("stop_token_ids", []), stops.get("stop_token_ids_hidden", [])
    if isinstance(visible, list) and isinstance(hidden, list):
        return [*visible, *hidden]
    return hidden if isinstance(visible, list) else visible  # not a list: the check refuses it by name


def sampling_params(request: dict[str, Any], context: int, prompt: int) -> SamplingParams:
    """The scheduler's parameters for a request of `prompt` tokens on a `context`-token engine (no grammar yet: the
    worker compiles guide_of's constraint); InvalidSampling naming the field otherwise."""
    sampling, stops, outputs = (_set(request.get(group) or {}, group, allowed) for group, allowed in GROUPS.items())
    sent = {key: value for group in (sampling, stops, outputs) for key, value in group.items() if key in CHECKED}
    params = checked(SamplingRequest(**sent, stop_token_ids=_stop_ids(stops), names=NAMES)).fit(context, prompt)
    return replace(params, stop=())  # checked as the HTTP API's, matched by Dynamo's postprocessor on its text


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
