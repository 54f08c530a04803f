"""Tool calls in the formats the supported families were trained on: finding them in the model's text, and the
grammar that forces one when a request requires it (tool_choice "required" or a named function).

- llama3_json (Llama 3.1/3.2): the reply is a JSON object {"name": ..., "parameters": {...}}, optionally after
  <|python_tag|>; several are separated by ";".
- hermes (Qwen2/2.5, Qwen3, Hermes): any number of <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  blocks, after optional text.
- mistral: [TOOL_CALLS] then a JSON list of {"name": ..., "arguments": {...}}, after optional text.
- phi4_mini (Phi-4-mini-instruct): <|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>, after
  optional text. Its chat template reads the tools from the system message's "tools" key (a JSON string), not
  from the template's `tools` variable, so they are put there (place_tools).
- granite (Granite 3.x instruct): the reply opens with <|tool_call|> and a JSON list of {"name": ...,
  "arguments": {...}}, with no closing marker.

vLLM keeps these parsers inside its server and no small library offers them, so they are written here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from runtimes.generation.guided import lark_string
from runtimes.ids import hex_id

ToolFormatName = Literal["llama3_json", "hermes", "mistral", "phi4_mini", "granite"]  # = settings.TOOL_PARSERS
Shape = Literal["blocks", "list", "sequence"]  # each call wrapped in markers; one JSON list; values one after another


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)
    id: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolFormat:
    name: ToolFormatName
    starts: tuple[str, ...]  # text that opens the tool calls
    anywhere: bool  # the calls may follow some text (else only a reply that opens with them is one)
    key: str  # the arguments' key inside a call
    shape: Shape
    end: str | None = None  # the marker that closes a block (blocks) or the list (list), if the format has one
    joiner: str = ", "  # between two calls of a list, as the template writes them
    system_tools: bool = False  # the template reads the tools from the system message (Phi-4-mini)

    @property
    def markers(self) -> tuple[str, ...]:
        return (*self.starts, self.end) if self.end else self.starts

    def split(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole reply; no calls when it holds none that parse."""
        at = self.opening(text)
        if at < 0:
            return text, []
        calls = self._calls(text[at:])
        if not calls:
            return text, []
        content = text[:at].strip()
        return content or None, calls

    def opening(self, text: str) -> int:
        """Where the tool calls start in text, or -1."""
        if self.anywhere:
            found = [i for i in (text.find(s) for s in self.starts) if i >= 0]
            return min(found) if found else -1
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith(self.starts) else -1

    def _calls(self, text: str) -> list[ToolCall]:
        if self.shape == "blocks":
            opens = "|".join(re.escape(s) for s in self.starts)
            close = re.escape(self.end or "")
            bodies = re.findall(rf"(?:{opens})\s*(.*?)\s*(?:{close}|$)", text, flags=re.S)
            values = [_json(body) for body in bodies]
        else:
            for marker in ("<|python_tag|>",) if self.shape == "sequence" else self.markers:
                text = text.replace(marker, " ")
            values = _json_sequence(text)
            if self.shape == "list":  # one list, or (Phi-4-mini) one list per block
                values = [item for value in values for item in (value if isinstance(value, list) else [value])]
        calls = [c for c in (_call(value, self.key) for value in values) if c is not None]
        return calls if len(calls) == len(values) else []  # one value that is not a call: none are

    def forced(self, tools: list[dict[str, Any]], parallel: bool, token_ids: dict[str, int]) -> str:
        """A Lark grammar whose every output is one (or, if parallel, several) calls of these tools."""
        def mark(text: str) -> str:
            return f"<[{token_ids[text]}]>" if text in token_ids else lark_string(text)

        # Written as the chat templates write a call back (tojson's ", " and ": "), with no free whitespace.
        schema = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
                  "anyOf": [{"type": "object", "properties": {
            "name": {"const": t["name"]}, self.key: t.get("parameters") or {"type": "object"}},
            "required": ["name", self.key], "additionalProperties": False} for t in tools]}
        rules = ["call: %json " + json.dumps(schema)]
        closing = f" {mark(self.end)}" if self.end else ""
        if self.shape == "blocks":
            start = 'tc ("\\n" tc)*' if parallel else "tc"
            rules.append(f'tc: {mark(self.starts[0])} "\\n" call "\\n"{closing}')
        elif self.shape == "list":
            more = f" ({lark_string(self.joiner)} call)*" if parallel else ""
            start = f'{mark(self.starts[0])} "[" call{more} "]"{closing}'
        else:
            start = 'call ("; " call)*' if parallel else "call"
        return "\n".join([f"start: {start}", *rules]) + "\n"

    def place_tools(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                    ) -> list[dict[str, Any]]:
        """The messages as this format's template wants them: with system_tools, the functions go into the system
        message's "tools" key as JSON text (a system message with no text is added when there is none)."""
        if not (self.system_tools and tools):
            return messages
        listed = json.dumps([tool.get("function", tool) for tool in tools], ensure_ascii=False)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "tools": listed}, *messages[1:]]
        return [{"role": "system", "content": "", "tools": listed}, *messages]


TOOL_FORMATS = {
    "llama3_json": ToolFormat("llama3_json", ("<|python_tag|>", "{"), anywhere=False, key="parameters",
                              shape="sequence"),
    "hermes": ToolFormat("hermes", ("<tool_call>",), anywhere=True, key="arguments", shape="blocks",
                         end="</tool_call>"),
    "mistral": ToolFormat("mistral", ("[TOOL_CALLS]",), anywhere=True, key="arguments", shape="list", joiner=","),
    "phi4_mini": ToolFormat("phi4_mini", ("<|tool_call|>",), anywhere=True, key="arguments", shape="list",
                            end="<|/tool_call|>", system_tools=True),
    # Granite 3.0-3.2 write <|tool_call|>; the <tool_call> that some 3.x checkpoints emit opens a call too.
    "granite": ToolFormat("granite", ("<|tool_call|>", "<tool_call>"), anywhere=False, key="arguments", shape="list"),
}


def chosen_format(parser: str, template: str | None) -> ToolFormat | None:
    """The tool format a server uses: the one its chat template was written for when parser is "auto", else the
    one named (MBUILD_TOOL_CALL_PARSER); None when there is neither."""
    found = detect_format(template) if template and parser == "auto" else None
    return TOOL_FORMATS.get(found or parser)


def detect_format(template: str) -> ToolFormatName | None:
    """The tool-call format a chat template was written for, from the text it renders. Phi-4-mini's template
    writes the system turn's tools between <|tool|> and <|/tool|>; Granite 3.x's has <|start_of_role|> turns and
    writes a call back after <|tool_call|> (or <tool_call>), or lists the tools in an "available_tools" turn.
    Those two go first: "<tool_call>" alone means Hermes/Qwen, whose calls are blocks, not Granite's list."""
    if "<|tool|>" in template and "<|/tool|>" in template:
        return "phi4_mini"
    if "<|start_of_role|>" in template and any(m in template for m in ("<|tool_call|>", "<tool_call>",
                                                                      "available_tools")):
        return "granite"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "ipython" in template or "<|python_tag|>" in template:
        return "llama3_json"
    return None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _json_sequence(text: str) -> list[Any]:
    """JSON values one after another, separated by blanks or ";"; [] if anything else is in between."""
    decoder, values, at = json.JSONDecoder(), list[Any](), 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return []
        values.append(value)


def _call(value: Any, key: str) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(key, value.get("arguments", value.get("parameters", {})))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), f"call_{hex_id(24)}")


class ToolText:
    """A streamed reply, split as it comes: content goes out at once, tool calls are held to the end (a call
    is sent whole, in OpenAI's delta shape), and text that may be the start of a call waits until it is known.
    Whitespace before a call is not content (as split() has it), so trailing whitespace waits for what follows."""

    def __init__(self, form: ToolFormat) -> None:
        self.form, self.held = form, ""
        self.gap = ""  # the whitespace held before the calls began: content after all if they do not parse
        self.calling = False  # the calls have begun: everything else is held
        self.plain = False  # a reply that could only open with a call did not: all of it is content

    def feed(self, text: str) -> str:
        """The content that can go out now."""
        self.held += text
        if self.calling:
            return ""
        if not self.plain:
            at = self.form.opening(self.held)
            if at >= 0:
                self.calling = True
                out = self.held[:at].rstrip()
                self.gap, self.held = self.held[len(out):at], self.held[at:]
                return out
            if not self.form.anywhere:
                stripped = self.held.lstrip()
                if not stripped or any(s.startswith(stripped) for s in self.form.starts):
                    return ""
                self.plain = True
        if self.plain:
            out, self.held = self.held, ""
            return out
        ready = len(self.held[:len(self.held) - _open_tail(self.held, self.form.starts)].rstrip())
        out, self.held = self.held[:ready], self.held[ready:]
        return out

    def end(self) -> tuple[str, list[ToolCall]]:
        """What is left once the reply is whole: content not sent yet, and the calls."""
        text, self.held = self.held, ""
        _, calls = self.form.split(text) if self.calling else (None, [])
        return ("", calls) if calls else (self.gap + text, [])


def _open_tail(text: str, starts: tuple[str, ...]) -> int:
    """The length of text's longest ending that some start marker begins with."""
    return max((k for s in starts for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
