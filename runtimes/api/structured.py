"""What a request asks its output to be: a JSON schema, a regex, a choice or a grammar (OpenAI's response_format,
vLLM's guided_*, NIM's nvext.guided_*), or a call of the tools it offers. Turned here into one compiled
grammar, or a 400 that names the field and says what is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtimes.api.admission import off_loop
from runtimes.api.errors import ApiError
from runtimes.api.schemas_generation import ChatCompletionRequest, ChatMessage, Guided, NamedToolChoice, SamplingFields
from runtimes.generation.guided import Grammar, GuideSpec
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.sampling_request import check_guide, compile_guide
from runtimes.generation.tools import ToolFormat
from runtimes.settings import TOOL_PARSERS


def _guided_fields(prefix: str, fields: Guided) -> list[tuple[str, GuideSpec]]:
    found: list[tuple[str, GuideSpec]] = []
    if fields.guided_json is not None:
        found.append((f"{prefix}guided_json", GuideSpec("json_schema", fields.guided_json)))
    if fields.guided_regex is not None:
        found.append((f"{prefix}guided_regex", GuideSpec("regex", fields.guided_regex)))
    if fields.guided_choice is not None:
        found.append((f"{prefix}guided_choice", GuideSpec("choice", fields.guided_choice)))
    if fields.guided_grammar is not None:
        found.append((f"{prefix}guided_grammar", GuideSpec("lark", fields.guided_grammar)))
    return [(name, check_guide(name, spec)) for name, spec in found]


def guide_spec(body: SamplingFields) -> tuple[str, GuideSpec] | None:
    """The one output constraint a request sets, with the field that set it."""
    found = _guided_fields("", body) + (_guided_fields("nvext.", body.nvext) if body.nvext else [])
    form = body.response_format
    if form is not None and form.type == "json_object":
        found.append(("response_format", GuideSpec("json_object", None)))
    elif form is not None and form.type == "json_schema":
        if form.json_schema is None:
            raise ApiError(400, "'response_format' of type json_schema needs its 'json_schema' object "
                                "({\"name\": ..., \"schema\": {...}})", "invalid_response_format")
        found.append(("response_format", GuideSpec("json_schema", form.json_schema.schema_)))
    if len(found) > 1:
        raise ApiError(400, f"{', '.join(repr(name) for name, _ in found)} each constrain the output; send one",
                       "conflicting_constraints")
    return found[0] if found else None


@dataclass(frozen=True)
class ToolUse:
    form: ToolFormat | None  # None: harmony (gpt-oss), whose reader finds the calls itself
    forced: str | None  # the Lark grammar of the calls tool_choice requires, if it requires one


def check_tool_results(messages: list[ChatMessage]) -> None:
    """Each tool message answers a call an earlier assistant message made, by its id, as OpenAI requires: a
    result for no call would reach the template as a conversation the model was never taught."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        called.update(call.id for call in message.tool_calls or ())
        if message.role != "tool":
            continue
        if not message.tool_call_id:
            raise ApiError(400, f"'messages[{i}]' has role 'tool' but no 'tool_call_id': send the id of the call "
                                "it answers", "invalid_messages")
        if message.tool_call_id not in called:
            raise ApiError(400, f"'messages[{i}]' answers tool_call_id {message.tool_call_id!r}, which no earlier "
                                "assistant message's 'tool_calls' holds: send the assistant message with that call "
                                "before its result", "invalid_messages")


def tool_use(body: ChatCompletionRequest, runtime: GenerationRuntime) -> ToolUse | None:
    """How this request's output is read for tool calls (None: it is not), from tools and tool_choice."""
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if not body.tools:
        if choice != "none":
            raise ApiError(400, "'tool_choice' needs 'tools': send the functions the model may call", "invalid_tools")
        return None
    names = [tool.function.name for tool in body.tools]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # a call names its function: which of two would it be?
        raise ApiError(400, f"'tools' holds more than one function named {', '.join(map(repr, twice))}: give "
                            "each function its own name", "invalid_tools")
    if runtime.harmony is not None:
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise ApiError(400, "this model (gpt-oss) writes its calls in harmony's channels, which this server does "
                                "not force yet: send tool_choice 'auto' (or 'none')", "unsupported_parameter")
        return None if choice == "none" else ToolUse(None, None)
    form = runtime.tool_format
    if form is None:
        raise ApiError(400, "this model's chat template does not render tools, so it was not taught a tool-call "
                            "format; if it was, start the server with MBUILD_TOOL_CALL_PARSER set to one of "
                            f"{', '.join(TOOL_PARSERS)}", "tools_unsupported")
    if choice == "none":
        return None
    functions = [tool.function.model_dump(exclude_none=True) for tool in body.tools]
    if isinstance(choice, NamedToolChoice):
        named = [f for f in functions if f["name"] == choice.function.name]
        if not named:
            raise ApiError(400, f"'tool_choice' names {choice.function.name!r}, which is not among 'tools'",
                           "invalid_tools")
        return ToolUse(form, form.forced(named, False, runtime.tool_tokens()))
    if choice == "required":
        return ToolUse(form, form.forced(functions, body.parallel_tool_calls, runtime.tool_tokens()))
    return ToolUse(form, None)


async def compile_constraint(runtime: GenerationRuntime, spec: tuple[str, GuideSpec | str] | None
                             ) -> Grammar | None:
    """The compiled grammar, off the event loop (a large schema takes milliseconds); a 400 naming the field."""
    if spec is None:
        return None
    return await off_loop(compile_guide, runtime.grammars, *spec)


def tools_for_template(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    return [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
