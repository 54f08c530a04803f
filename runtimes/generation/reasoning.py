"""Reasoning written between <think> and </think> before the answer (Qwen3, DeepSeek-R1 and their distills),
told apart from the answer as the reply streams.

The tags come from the chat template: one that writes both <think> and </think> (Qwen3's writes an assistant
message's reasoning_content back between them, and an empty pair when enable_thinking is false) was written for
a model that reasons. A reply opens its reasoning with <think>, or the generation prompt opened it already
(DeepSeek-R1's and Qwen3-Thinking-2507's templates end with "<think>\\n"). vLLM keeps its reasoning parsers in
its server and no small library offers one, so this is written here.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def detect_reasoning(template: str) -> bool:
    """Whether a chat template was written for a model that thinks between <think> and </think>."""
    return OPEN in template and CLOSE in template


def opened_by(generation_prompt: str) -> bool:
    """Whether the text the template adds for the reply leaves a <think> open, so the reply starts reasoning."""
    return generation_prompt.rfind(OPEN) > generation_prompt.rfind(CLOSE)


def _open_tail(text: str, markers: tuple[str, ...]) -> int:
    """The length of text's longest ending that some marker begins with."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)


class ThinkText:
    """A reply split as it comes into (reasoning, answer). The reasoning is stripped of the blank lines around
    it and the answer of those that open it, so text that may be one of those, or the start of a marker, waits
    until what follows shows which it is: the pieces of any chunking add up to those of the whole.

    calls: the markers that open a tool call. A call ends the reasoning as </think> does (a model that calls
    from inside its thinking, or after a </think> that was cut off), and the marker stays in the answer for the
    tool-call parser."""

    def __init__(self, opened: bool, calls: tuple[str, ...] = ()) -> None:
        self.state = "reasoning" if opened else "start"  # start | reasoning | answer | content
        self.ends = (CLOSE, *calls)
        self.held = ""
        self.begun = False  # reasoning text went out (its leading blank lines are behind)
        self.fed = 0  # characters fed so far
        # Where the answer starts in the text fed (what comes before is reasoning, its tags and the blank lines
        # after them); None until known. Once the reply ends in its reasoning, all of it is.
        self.answer_at: int | None = None

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) that can go out now."""
        self.held += text
        self.fed += len(text)
        reasoning = answer = ""
        if self.state == "start":
            stripped = self.held.lstrip()
            if not stripped or (OPEN.startswith(stripped) and stripped != OPEN):
                return "", ""
            if stripped.startswith(OPEN):
                self.state, self.held = "reasoning", stripped[len(OPEN):]
            else:
                self.state, self.answer_at = "content", 0  # no reasoning: the reply is all answer, as written
        if self.state == "reasoning":
            reasoning = self._reasoning()
        if self.state in ("answer", "content"):
            answer = self._answer()
        return reasoning, answer

    def end(self) -> tuple[str, str]:
        """What is left once the reply is whole."""
        if self.state == "start":
            self.state = "content"
        reasoning, answer = self.feed("")
        if self.state == "reasoning":  # cut off while thinking: what it thought is reasoning
            reasoning += self.held.rstrip()  # its leading blank lines are gone already
        else:
            answer += self.held
        self.held = ""
        if self.answer_at is None:
            self.answer_at = self.fed
        return reasoning, answer

    def _reasoning(self) -> str:
        if not self.begun:
            self.held = self.held.lstrip()
        found = [(i, m) for m in self.ends if (i := self.held.find(m)) >= 0]
        if found:
            at, marker = min(found)
            out = self.held[:at].rstrip()
            self.held = self.held[at + len(marker):] if marker == CLOSE else self.held[at:]
            self.state = "answer" if marker == CLOSE else "content"
            if self.state == "content":  # a call's marker opens the answer
                self.answer_at = self.fed - len(self.held)
            return out
        ready = len(self.held[:len(self.held) - _open_tail(self.held, self.ends)].rstrip())
        out, self.held = self.held[:ready], self.held[ready:]
        self.begun = self.begun or bool(out)
        return out

    def _answer(self) -> str:
        if self.state == "answer":  # the blank lines after </think> are not the answer's
            self.held = self.held.lstrip()
            if not self.held:
                return ""
            self.state, self.answer_at = "content", self.fed - len(self.held)
        out, self.held = self.held, ""
        return out
