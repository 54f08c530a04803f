"""A chat reply read as it streams: reasoning apart from the answer, tool calls held to the end. One reader per
choice, fed the text and token ids of each delta; a whole reply is one feed, so its message is exactly what
the chunks of its stream add up to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtimes.generation.harmony import Harmony, HarmonyText
from runtimes.generation.reasoning import ThinkText
from runtimes.generation.tools import ToolCall, ToolFormat, ToolText


@dataclass(frozen=True)
class ReplyFormat:
    """How one request's replies are read."""

    tools: ToolFormat | None = None  # calls are read in this format (None: tool_choice none, or no tools)
    think: bool = False  # the reply may reason between <think> and </think>
    opened: bool = False  # the generation prompt opened the reasoning
    harmony: Harmony | None = None  # gpt-oss: the reply is harmony messages (token ids), tools or not
    calls: bool = False  # with harmony: calls are read (tools were offered)

    @property
    def reasons(self) -> bool:
        return self.think or self.harmony is not None

    def reader(self) -> Reply:
        return Reply(self)


class Reply:
    def __init__(self, form: ReplyFormat) -> None:
        self.form = form
        self.harmony = HarmonyText(form.harmony) if form.harmony else None
        anywhere = form.tools.starts if form.tools and form.tools.anywhere else ()
        self.think = ThinkText(form.opened, anywhere) if form.think else None
        self.tools = ToolText(form.tools) if form.tools and not form.harmony else None

    def feed(self, text: str, tokens: Sequence[int]) -> tuple[str, str]:
        """(reasoning, content) that can go out now."""
        if self.harmony:
            return self.harmony.feed(tokens)
        reasoning, content = self.think.feed(text) if self.think else ("", text)
        return reasoning, self.tools.feed(content) if self.tools else content

    def hidden(self, index: int, start: int, end: int) -> bool | None:
        """Whether the reply's token `index`, whose text spans [start, end) of the text fed, is the reasoning's (its
        tags and the blank lines after them included); None while that is not known yet."""
        if self.harmony:
            return self.harmony.hidden[index] if index < len(self.harmony.hidden) else None
        if not self.think:
            return False
        at = self.think.answer_at
        if at is None:
            return None
        return start < at and end <= at  # a token that reaches into the answer is the answer's

    def end(self) -> tuple[str, str, list[ToolCall]]:
        """(reasoning, content) left once the reply is whole, and its calls."""
        if self.harmony:
            rest, calls = self.harmony.end()
            return "", rest, calls if self.form.calls else []  # tool_choice none: no call is one
        reasoning, content = self.think.end() if self.think else ("", "")
        if not self.tools:
            return reasoning, content, []
        content = self.tools.feed(content)
        rest, calls = self.tools.end()
        return reasoning, content + rest, calls
