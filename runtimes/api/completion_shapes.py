"""The generation routes' streamed chunks, and log-probabilities in OpenAI's two shapes: the completions route's
parallel lists (tokens, token_logprobs, top_logprobs, text_offset; with echo, the prompt's tokens first, the
very first without a value), and the chat route's list of entries with their bytes and top alternatives."""

from __future__ import annotations

from collections import deque
from typing import Any

from tokenizers import Tokenizer

from runtimes.generation.logprobs import TokenLogprob
from runtimes.generation.reply import Reply, ReplyFormat
from runtimes.generation.stream import Delta
from runtimes.generation.tools import ToolCall


def _text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(tokenizer: Tokenizer, entries: list[tuple[int, TokenLogprob | None]],
                        offset: int = 0) -> dict[str, Any]:
    """entries: (token, its logprob or None) in order; offset: where the first token's text starts."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, entry in entries:
        text = _text(tokenizer, token)
        out["tokens"].append(text)
        out["token_logprobs"].append(None if entry is None else entry.logprob)
        out["top_logprobs"].append(None if entry is None else {_text(tokenizer, t): lp for t, lp in entry.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _chat_entry(tokenizer: Tokenizer, token: int, logprob: float) -> dict[str, Any]:
    text = _text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{**_chat_entry(tokenizer, e.token, e.logprob),
                         "top_logprobs": [_chat_entry(tokenizer, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


class AnswerLogprobs:
    """A choice's logprobs with its reasoning left out (include_reasoning false): a token's entry waits until the
    reply's reader knows whether the token is the answer's; the reasoning's, its tags included, never go out, so
    they cannot spell out what the reply hides."""

    def __init__(self, reader: Reply) -> None:
        self.reader = reader
        self.waiting: deque[tuple[int, int, int, TokenLogprob]] = deque()  # (token index, start, end, entry)
        self.count = self.end = 0

    def take(self, entries: list[TokenLogprob], ends: list[int]) -> list[TokenLogprob]:
        """The entries that can go out now, of those waiting and these (the reader has been fed their text)."""
        for entry, end in zip(entries, ends, strict=True):
            self.waiting.append((self.count, self.end, end, entry))
            self.count, self.end = self.count + 1, end
        out = []
        while self.waiting and (hidden := self.reader.hidden(*self.waiting[0][:3])) is not None:
            entry = self.waiting.popleft()[3]
            if not hidden:
                out.append(entry)
        return out


class ChatChunks:
    """A chat stream's chunks: reasoning (delta.reasoning_content, vLLM's and NIM's field) and content go out as
    they come, each tool call whole at the end."""

    def __init__(self, ident: str, model: str, created: int, n: int, tokenizer: Tokenizer, reply: ReplyFormat,
                 include_reasoning: bool = True) -> None:
        self.base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
        self.n, self.tokenizer, self.include_reasoning = n, tokenizer, include_reasoning
        self.readers = {i: reply.reader() for i in range(n)}
        hides = reply.reasons and not include_reasoning
        self.shown = {i: AnswerLogprobs(reader) for i, reader in self.readers.items()} if hides else {}

    def first(self) -> list[dict[str, Any]]:
        return [{**self.base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}]} for i in range(self.n)]

    def _chunk(self, index: int, delta: dict[str, Any], logprobs: list[TokenLogprob], finish: str | None
               ) -> dict[str, Any]:
        return {**self.base, "choices": [{"index": index, "delta": delta, "finish_reason": finish,
                                          "logprobs": chat_logprobs(self.tokenizer, logprobs) if logprobs else None}]}

    def pieces(self, index: int, delta: Delta) -> list[dict[str, Any]]:
        reader, calls = self.readers[index], list[ToolCall]()
        reasoning, text = reader.feed(delta.text, delta.tokens)
        if delta.finish:
            more, rest, calls = reader.end()
            reasoning, text = reasoning + more, text + rest
        fields = {"reasoning_content": reasoning} if reasoning and self.include_reasoning else {}
        fields |= {"content": text} if text else {}
        logprobs = self.shown[index].take(delta.logprobs, delta.ends) if self.shown else delta.logprobs
        out = [self._chunk(index, fields, logprobs, None)] if fields or logprobs else []
        for number, call in enumerate(calls):  # OpenAI's shape: id and name first, then the arguments
            opening = {"index": number, "id": call.id, "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            out.append(self._chunk(index, {"tool_calls": [opening]}, [], None))
            out.append(self._chunk(index, {"tool_calls": [{"index": number, "function": {
                "arguments": call.arguments}}]}, [], None))
        if delta.finish:
            out.append(self._chunk(index, {}, [], "tool_calls" if calls else delta.finish))
        return out

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}


def chat_message(text: str, tokens: list[int], reply: ReplyFormat, finish: str | None,
                 include_reasoning: bool = True, logprobs: tuple[list[TokenLogprob], list[int]] = ([], [])
                 ) -> tuple[dict[str, Any], str | None, list[TokenLogprob]]:
    """A whole reply as OpenAI's assistant message, its finish reason (tool_calls when it made calls) and the
    logprobs it shows (entries and their tokens' text ends; the reasoning's are left out with the reasoning): read
    as its stream is, in one piece, so the two agree. reasoning_content is there for a model that reasons."""
    reader = reply.reader()
    reasoning, content = reader.feed(text, tokens)
    more, rest, calls = reader.end()
    reasoning, content = reasoning + more, content + rest
    shown = AnswerLogprobs(reader).take(*logprobs) if reply.reasons and not include_reasoning else logprobs[0]
    message: dict[str, Any] = {"role": "assistant", "content": (content or None) if calls else content}
    if reply.reasons and include_reasoning:
        message["reasoning_content"] = reasoning or None
    if not calls:
        return message, finish, shown
    return {**message, "tool_calls": [c.openai() for c in calls]}, "tool_calls", shown


class CompletionChunks:
    """With echo, a choice's first chunk starts with its prompt (and the prompt's logprobs, if asked)."""

    def __init__(self, ident: str, model: str, created: int, tokenizer: Tokenizer,
                 echo: list[tuple[str, list[int]]] | None, wants_logprobs: bool) -> None:
        self.base = {"id": ident, "object": "text_completion", "created": created, "model": model}
        self.tokenizer, self.echo, self.wants = tokenizer, echo, wants_logprobs
        self.offsets: dict[int, int] = {}

    def first(self) -> list[dict[str, Any]]:
        return []

    def pieces(self, index: int, delta: Delta) -> list[dict[str, Any]]:
        out = [self.piece(index, delta, None)] if delta.text or delta.logprobs or delta.prompt_logprobs else []
        return out + ([self.piece(index, None, delta.finish)] if delta.finish else [])

    def piece(self, index: int, delta: Delta | None, finish: str | None) -> dict[str, Any]:
        text = delta.text if delta else ""
        entries: list[tuple[int, TokenLogprob | None]] = [(e.token, e) for e in delta.logprobs] if delta else []
        if index not in self.offsets:
            self.offsets[index] = 0
            if self.echo is not None:
                prompt_text, prompt_ids = self.echo[index]
                text = prompt_text + text
                entries = prompt_entries(prompt_ids, delta.prompt_logprobs if delta else None) + entries
        logprobs = completion_logprobs(self.tokenizer, entries, self.offsets[index]) if self.wants else None
        self.offsets[index] += len(text)
        return {**self.base, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                          "finish_reason": finish}]}

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage}

    def whole(self, index: int, text: str, logprobs: list[TokenLogprob],
              prompt: tuple[TokenLogprob | None, ...] | None, finish: str | None) -> dict[str, Any]:
        """A non-streamed choice: the same text and logprobs as its chunks joined."""
        choice: dict[str, Any] = self.piece(index, Delta(text, None, 0, logprobs, prompt_logprobs=prompt),
                                            finish)["choices"][0]
        return choice


def prompt_entries(prompt: list[int], logprobs: tuple[TokenLogprob | None, ...] | None
                   ) -> list[tuple[int, TokenLogprob | None]]:
    values = logprobs or (None,) * len(prompt)
    return list(zip(prompt, values, strict=False))
