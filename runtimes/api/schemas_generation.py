"""Request bodies of the OpenAI-compatible text-generation routes (plus vLLM's common extras).

Every field is bounded and takes only its JSON type (schemas.STRICT), and a field the server does not implement
is refused with a 400 that names it (extra="forbid"), never ignored. Messages keep extra="ignore": clients send
back assistant messages with metadata (refusal, annotations) that does not change what is generated.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from annotated_types import Interval
from pydantic import BaseModel, Field, field_validator, model_validator

from runtimes.api.schemas import EXTRAS_IGNORED, STRICT, TEXTS_OR_IDS
from runtimes.generation.chat_template import TEMPLATE_GLOBALS, server_name
from runtimes.generation.guided import MAX_CHOICES
from runtimes.generation.harmony import Effort
from runtimes.generation.sampling import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS
from runtimes.generation.sampling_request import BOUNDS, MAX_CHOICE_CHARS, MAX_GRAMMAR

MAX_PROMPTS = 64
MAX_MESSAGES = 4096
MAX_NAME = 256
MAX_TOOLS = 128
MAX_DESCRIPTION = 4096
MAX_TEMPLATE_KWARGS = 16  # a few switches (enable_thinking), not a second body
MAX_TEMPLATE_TEXT = 1024
TEMPLATE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a jinja variable's name


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class FunctionDef(BaseModel):
    model_config = EXTRAS_IGNORED
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")  # OpenAI's rule for names
    description: str | None = Field(None, max_length=MAX_DESCRIPTION)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _OfFunction(BaseModel):
    model_config = STRICT
    type: Literal["function"]


class Tool(_OfFunction):
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = EXTRAS_IGNORED
    name: str = Field(max_length=64)


class NamedToolChoice(_OfFunction):
    function: FunctionName


class CalledFunction(FunctionName):
    arguments: str = Field(max_length=MAX_DESCRIPTION * 16)


class AssistantToolCall(BaseModel):
    """A tool call sent back in an assistant message of the conversation."""

    model_config = EXTRAS_IGNORED
    id: str = Field(max_length=MAX_NAME)
    type: Literal["function"] = "function"
    function: CalledFunction


class JsonSchemaFormat(BaseModel):
    model_config = EXTRAS_IGNORED
    name: str = Field("response", max_length=64)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION)
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Guided(BaseModel):
    """vLLM's guided decoding fields (also NIM's, inside "nvext")."""

    model_config = STRICT
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(None, max_length=MAX_GRAMMAR)
    guided_choice: list[Annotated[str, Field(min_length=1, max_length=MAX_CHOICE_CHARS)]] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES)
    guided_grammar: str | None = Field(None, max_length=MAX_GRAMMAR)  # llguidance's Lark syntax


class TextPart(BaseModel):
    model_config = EXTRAS_IGNORED
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = EXTRAS_IGNORED
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(max_length=256)] | None = None
    name: str | None = Field(None, max_length=MAX_NAME)
    tool_calls: list[AssistantToolCall] | None = Field(None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(None, max_length=MAX_NAME)
    reasoning_content: str | None = None  # an assistant message's reasoning, sent back (Qwen3's template reads it)

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as transformers hands it to a chat template: a tool call's arguments as an object."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            out["name"] = self.name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content and self.role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _object(c.function.arguments)}} for c in self.tool_calls]
        return out


def _object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # a template shows it as sent


def _within(field: str) -> Interval:
    """The shared check's bounds for a field (sampling_request.BOUNDS): documented in the schema, refused early."""
    bound = BOUNDS[field]
    return Interval(gt=bound.low, le=bound.high) if bound.above else Interval(ge=bound.low, le=bound.high)


class SamplingFields(Guided):
    """Fields both routes share. Their values are checked again, with every front door's, by sampling_request."""

    model_config = STRICT

    model: str | None = Field(None, max_length=MAX_NAME)
    max_tokens: Annotated[int, _within("max_tokens")] | None = None
    temperature: Annotated[float, _within("temperature")] = 1.0
    top_p: Annotated[float, _within("top_p")] = 1.0
    n: int = Field(1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, _within("seed")] | None = None
    presence_penalty: Annotated[float, _within("presence_penalty")] = 0.0
    frequency_penalty: Annotated[float, _within("frequency_penalty")] = 0.0
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    user: str | None = Field(None, max_length=MAX_NAME)
    # vLLM's extras, which benchmark clients send
    top_k: Annotated[int, _within("top_k")] = 0
    min_tokens: Annotated[int, _within("min_tokens")] = 0
    ignore_eos: bool = False
    repetition_penalty: Annotated[float, _within("repetition_penalty")] = 1.0
    stop_token_ids: list[int] = Field(default_factory=list, max_length=MAX_STOP_TOKEN_IDS)
    skip_special_tokens: bool = True
    speculative: bool = True  # false: no speculative decoding for this request, whatever the server's setting
    response_format: ResponseFormat | None = None
    nvext: Guided | None = None  # NIM's extension object


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Annotated[int, _within("max_tokens")] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, _within("logprobs")] | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # Reasoning models: vLLM's switch to leave the reasoning out of the reply, the template's own switches
    # (vLLM's chat_template_kwargs, e.g. Qwen3's {"enable_thinking": false}), and OpenAI's reasoning effort
    # (gpt-oss's harmony system message; other templates get it as the variable reasoning_effort).
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(None, max_length=MAX_TEMPLATE_KWARGS)
    reasoning_effort: Effort | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, item in (value or {}).items():
            if not TEMPLATE_NAME.fullmatch(key):
                raise ValueError(f"keys are template variable names (letters, digits, _; at most 64), not {key[:20]!r}")
            if server_name(key):
                raise ValueError(f"{key!r} is set by the server itself; send the request's own field instead")
            if key in TEMPLATE_GLOBALS:
                raise ValueError(f"{key!r} is a function the chat template may call; name the variable otherwise")
            if item is not None and not isinstance(item, bool | int | float | str):
                raise ValueError(f"{key!r}: values are strings, numbers, booleans or null, not {type(item).__name__}")
            if isinstance(item, str) and len(item) > MAX_TEMPLATE_TEXT:
                raise ValueError(f"{key!r}: a text value has at most {MAX_TEMPLATE_TEXT} characters")
        return value

    @model_validator(mode="after")
    def _one_effort(self) -> ChatCompletionRequest:
        # The renderer sets the template's reasoning_effort from the field: the two must not disagree unseen.
        if self.reasoning_effort is not None and "reasoning_effort" in (self.chat_template_kwargs or {}):
            raise ValueError("send reasoning_effort once: as the field or in chat_template_kwargs, not both")
        return self


class CompletionRequest(SamplingFields):
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], TEXTS_OR_IDS]
    max_tokens: Annotated[int, _within("max_tokens")] | None = 16  # OpenAI's default for this route
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = Field(None, max_length=1)  # only the empty suffix: insertion is not implemented
