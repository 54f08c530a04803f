"""gpt-oss's harmony format, through OpenAI's openai-harmony: the conversation rendered to token ids by its
renderer, and the reply read by its StreamableParser (the analysis channel is the reasoning, final the answer, a
commentary message to functions.NAME a tool call).

openai-harmony loads its vocabulary, o200k_base.tiktoken, from the folder TIKTOKEN_ENCODINGS_BASE names (and checks
the file's SHA-256), or else downloads it, which an image serving offline cannot. gpt-oss's tokenizer.json holds
the same ranks (o200k_harmony is o200k_base plus special tokens), so the file is written from it at start, into
/tmp, which the image keeps writable: a rank -> bytes table written as "base64 rank" lines in rank order is that
file byte for byte (measured: quicktok-v1's copy of the o200k ranks written so hashes to harmony's 446a9538...).
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
from collections.abc import Iterable
from datetime import date
from pathlib import Path
from typing import Any, Literal

from runtimes.bundle import BundleError
from runtimes.generation.chat_template import ChatTemplateError
from runtimes.generation.tools import ToolCall
from runtimes.ids import hex_id
from runtimes.settings import export_harmony_vocabulary

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # openai-harmony checks the same
Effort = Literal["low", "medium", "high"]  # harmony's reasoning efforts, as OpenAI's reasoning_effort names them
CALL_TYPE = "<|constrain|>json"  # how gpt-oss marks a call's arguments as JSON


def detect_harmony(template: str) -> bool:
    """gpt-oss's chat template writes harmony's message headers itself."""
    return all(marker in template for marker in ("<|start|>", "<|channel|>", "<|message|>"))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a tokenizer.json writes for each byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return {c: b for b, c in chars.items()}


def vocabulary(tokenizer_json: dict[str, Any]) -> bytes:
    """o200k_base.tiktoken's text from a byte-level BPE tokenizer.json: its ranks, special tokens left out."""
    special = {t.get("id") for t in tokenizer_json.get("added_tokens", [])}
    vocab: dict[str, int] = tokenizer_json.get("model", {}).get("vocab", {})
    decode = _byte_decoder()
    ranks: dict[int, bytes] = {}
    for text, rank in vocab.items():
        if rank not in special:
            try:
                ranks[rank] = bytes(decode[c] for c in text)
            except KeyError as exc:
                raise BundleError(f"tokenizer.json token {text!r} is not byte-level BPE, so it is not gpt-oss's "
                                  "o200k vocabulary") from exc
    if sorted(ranks) != list(range(len(ranks))):
        raise BundleError("tokenizer.json's ranks are not 0..n-1, so it is not gpt-oss's o200k vocabulary")
    return b"".join(base64.b64encode(ranks[r]) + b" %d\n" % r for r in range(len(ranks)))


def vocabulary_folder(tokenizer_file: Path, given: Path | None) -> Path:
    """A folder holding o200k_base.tiktoken: given (TIKTOKEN_ENCODINGS_BASE), else written from tokenizer.json
    under /tmp, once per content (a restarted server finds it). Refused with what to do when it is not o200k."""
    if given is not None:
        if not (given / VOCAB_FILE).is_file():
            raise BundleError(f"TIKTOKEN_ENCODINGS_BASE is {given}, which holds no {VOCAB_FILE}")
        return given
    try:
        text = vocabulary(json.loads(tokenizer_file.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read {tokenizer_file} for gpt-oss's vocabulary: {exc}") from exc
    digest = hashlib.sha256(text).hexdigest()
    if digest != VOCAB_SHA256:
        raise BundleError(f"{tokenizer_file}'s ranks are not o200k_base's (sha256 {digest[:12]}, openai-harmony wants "
                          f"{VOCAB_SHA256[:12]}); set TIKTOKEN_ENCODINGS_BASE to a folder that holds OpenAI's "
                          f"{VOCAB_FILE}")
    folder = Path(tempfile.gettempdir()) / f"mbuild-harmony-{digest[:16]}"
    if not (folder / VOCAB_FILE).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{VOCAB_FILE}.{hex_id(8)}"
        partial.write_bytes(text)
        partial.replace(folder / VOCAB_FILE)  # whole or not there: two servers may start at once
    return folder


class Harmony:
    """The loaded encoding, and what a chat request needs of it."""

    def __init__(self, folder: Path) -> None:
        import openai_harmony as oh  # here: a model that does not speak harmony never loads it

        export_harmony_vocabulary(folder)
        try:
            self.encoding = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
        except oh.HarmonyError as exc:
            raise BundleError(f"openai-harmony cannot load its vocabulary from {folder}: {exc}") from exc
        self.oh = oh
        self.stops = tuple(self.encoding.stop_tokens_for_assistant_actions())  # <|return|>, <|call|>

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               effort: str | None) -> list[int]:
        """The prompt's token ids: harmony's system message (reasoning effort, date), the request's system and
        developer texts with the tools as the developer message, then the turns, ending where the reply starts."""
        oh = self.oh
        system = oh.SystemContent.new().with_conversation_start_date(date.today().isoformat())
        system = system.with_reasoning_effort(oh.ReasoningEffort((effort or "medium").capitalize()))
        rendered = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
        instructions = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
        if instructions or tools:
            developer = oh.DeveloperContent.new().with_instructions(instructions) if instructions \
                else oh.DeveloperContent.new()
            if tools:
                developer = developer.with_function_tools([oh.ToolDescription.new(
                    t["function"]["name"], t["function"].get("description", ""), t["function"].get("parameters"))
                    for t in tools])
            rendered.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
        names: dict[str, str] = {}  # a call's id -> its function, which a tool message answers
        for message in messages:
            rendered += self._turn(message, names)
        conversation = oh.Conversation.from_messages(rendered)
        try:
            return list(self.encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT))
        except oh.HarmonyError as exc:  # the caller's messages: a 400, as a template's failure is
            raise ChatTemplateError(f"openai-harmony cannot render these messages: {exc}") from exc

    def _turn(self, message: dict[str, Any], names: dict[str, str]) -> list[Any]:
        oh, role, text = self.oh, message["role"], message["content"]
        if role == "user":
            return [oh.Message.from_role_and_content(oh.Role.USER, text)]
        if role == "tool":
            name = names.get(message.get("tool_call_id", ""), "tool")
            author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
            return [oh.Message.from_author_and_content(author, text).with_recipient("assistant")
                    .with_channel("commentary")]
        if role != "assistant":
            return []  # system and developer texts are in the developer message
        turn = []
        if message.get("reasoning_content"):  # the renderer drops it once a final answer follows, as gpt-oss wants
            turn.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, message["reasoning_content"])
                        .with_channel("analysis"))
        if text:
            turn.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("final"))
        for call in message.get("tool_calls") or ():
            function = call["function"]
            names[call["id"]] = function["name"]
            arguments = function["arguments"]
            turn.append(oh.Message.from_role_and_content(
                oh.Role.ASSISTANT, arguments if isinstance(arguments, str) else json.dumps(arguments))
                .with_channel("commentary").with_recipient(f"functions.{function['name']}")
                .with_content_type(CALL_TYPE))
        return turn


class HarmonyText:
    """A reply's token ids through harmony's StreamableParser, split as they come into (reasoning, answer): the
    analysis channel is reasoning; final, and commentary to no one (a preamble), are the answer; a message to
    functions.NAME is a call, sent whole at the end. Output the parser refuses (a model off its format) is
    answer text, as decoded."""

    def __init__(self, harmony: Harmony) -> None:
        self.harmony = harmony
        self.parser = harmony.oh.StreamableParser(harmony.encoding, role=harmony.oh.Role.ASSISTANT)
        self.ends = {*harmony.stops, *harmony.encoding.encode("<|end|>", allowed_special="all")}
        self.unread: list[int] = []  # tokens whose text has not gone out (a header, or all once parsing failed)
        self.failed = False
        # Per token fed: whether it belongs to a message of the analysis channel (the reasoning), header included;
        # None until its message's channel is known.
        self.hidden: list[bool | None] = []
        self.judged = 0  # tokens whose entry in hidden is known: those after are the current message's

    def feed(self, tokens: Iterable[int]) -> tuple[str, str]:
        reasoning = answer = ""
        for token in tokens:
            self.unread.append(token)
            self.hidden.append(None)
            if self.failed:
                self._judge(False)
                continue
            before = self.parser.current_channel
            try:
                self.parser.process(token)
            except self.harmony.oh.HarmonyError:
                self.failed = True
                self._judge(False)
                continue
            channel = self.parser.current_channel or before  # before: its <|end|> closed it
            if channel is not None:
                self._judge(channel == "analysis")
            if token in self.ends:
                self._judge(False)  # a message whose channel never came is no reasoning
            delta = self.parser.last_content_delta
            if delta and self.parser.current_recipient is None:
                if self.parser.current_channel == "analysis":
                    reasoning += delta
                else:
                    answer += delta
                self.unread = []
            if token in self.ends:  # a whole message: nothing of it is left to show as text
                self.unread = []
        return reasoning, answer

    def _judge(self, hidden: bool) -> None:
        """The current message's tokens not judged yet are (or are not) the reasoning's."""
        self.hidden[self.judged:] = [hidden] * (len(self.hidden) - self.judged)
        self.judged = len(self.hidden)

    def end(self) -> tuple[str, list[ToolCall]]:
        """The answer text left (what the parser could not read), and the calls."""
        self._judge(False)
        if not self.failed:
            try:
                self.parser.process_eos()
                self.unread = []
            except self.harmony.oh.HarmonyError:
                pass  # cut off inside a header, or no header at all: its tokens are text
        encoding = self.harmony.encoding
        rest = encoding.decode([t for t in self.unread if not encoding.is_special_token(t)])
        calls = [ToolCall(m.recipient.removeprefix("functions."), _text(m), f"call_{hex_id(24)}")
                 for m in self.parser.messages if m.recipient and m.recipient != "assistant"]
        return rest, calls


def _text(message: Any) -> str:
    return "".join(getattr(part, "text", "") for part in message.content)
