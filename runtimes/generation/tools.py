"""Tool calls in the formats the supported families were trained on: finding them in the model's text, and the
grammar that forces one when a request requires it (tool_choice "required" or a named function).

- llama3_json (Llama 3.1/3.2): the reply is a JSON object {"name": ..., "parameters": {...}}, optionally after
  <|python_tag|>; several are separated by ";".
- hermes (Qwen2/2.5, Hermes): any number of <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks,
  after optional text.
- mistral: [TOOL_CALLS] then a JSON list of {"name": ..., "arguments": {...}}, after optional text.

vLLM keeps these parsers inside its server and no small library offers them, so they are written here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from runtimes.generation.guided import lark_string
from runtimes.ids import hex_id

ToolFormatName = Literal["llama3_json", "hermes", "mistral"]  # settings.TOOL_PARSERS names the same


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
        if self.name == "hermes":
            bodies = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, flags=re.S)
            values = [_json(body) for body in bodies]
        else:
            values = _json_sequence(text.replace("<|python_tag|>", "").replace("[TOOL_CALLS]", ""))
            if self.name == "mistral" and len(values) == 1 and isinstance(values[0], list):
                values = values[0]
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
        if self.name == "hermes":
            start = 'tc ("\\n" tc)*' if parallel else "tc"
            rules.append(f'tc: {mark("<tool_call>")} "\\n" call "\\n" {mark("</tool_call>")}')
        elif self.name == "mistral":
            more = ' ("," call)*' if parallel else ""
            start = f'{mark("[TOOL_CALLS]")} "[" call{more} "]"'
        else:
            start = 'call ("; " call)*' if parallel else "call"
        return "\n".join([f"start: {start}", *rules]) + "\n"


TOOL_FORMATS = {
    "llama3_json": ToolFormat("llama3_json", ("<|python_tag|>", "{"), anywhere=False, key="parameters"),
    "hermes": ToolFormat("hermes", ("<tool_call>",), anywhere=True, key="arguments"),
    "mistral": ToolFormat("mistral", ("[TOOL_CALLS]",), anywhere=True, key="arguments"),
}


def detect_format(template: str) -> ToolFormatName | None:
    """The tool-call format a chat template was written for, from the markers it renders."""
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
    is sent whole, in OpenAI's delta shape), and text that may be the start of a call waits until it is known."""

    def __init__(self, form: ToolFormat) -> None:
        self.form, self.held = form, ""
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
                out, self.held = self.held[:at], self.held[at:]
                return out if out.strip() else ""
            if not self.form.anywhere:
                stripped = self.held.lstrip()
                if not stripped or any(s.startswith(stripped) for s in self.form.starts):
                    return ""
                self.plain = True
        keep = 0 if self.plain else _open_tail(self.held, self.form.starts)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def end(self) -> tuple[str, list[ToolCall]]:
        """What is left once the reply is whole: content not sent yet, and the calls."""
        text, self.held = self.held, ""
        _, calls = self.form.split(text) if self.calling else (None, [])
        return ("", calls) if calls else (text, [])


def _open_tail(text: str, starts: tuple[str, ...]) -> int:
    """The length of text's longest ending that some start marker begins with."""
    return max((k for s in starts for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
