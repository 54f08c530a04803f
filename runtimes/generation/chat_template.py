"""The model's chat template, rendered as transformers renders it (sandboxed jinja2)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.defaults import DEFAULT_NAMESPACE
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# What the server itself hands a template; a request's chat_template_kwargs may not stand in for these (transformers
# passes special tokens as *_token variables: bos_token, eos_token ...).
SERVER_NAMES = frozenset({"messages", "tools", "add_generation_prompt"})
# The functions a template may call: jinja's own (range, namespace ...) and the two transformers adds. A variable of
# the same name would hide one (Qwen3's template calls namespace()), so chat_template_kwargs may not use these either.
_FUNCTIONS = {"raise_exception": _raise, "strftime_now": _strftime_now}
TEMPLATE_GLOBALS = frozenset({*DEFAULT_NAMESPACE, *_FUNCTIONS})


def server_name(name: str) -> bool:
    return name in SERVER_NAMES or name.endswith("_token")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(_FUNCTIONS)
        try:
            self.template = env.from_string(source)
            self.source = source
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc
        self.special_tokens = special_tokens

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None) -> str:
        """tools: OpenAI's tool list, passed as transformers passes it (templates that know tools read it);
        extra: the request's chat_template_kwargs (Qwen3's enable_thinking), none of them a server_name or one of
        TEMPLATE_GLOBALS."""
        # One mapping, not keywords: a variable named "self" would otherwise collide with render's own argument.
        context = {**(extra or {}), "messages": messages, "add_generation_prompt": add_generation_prompt,
                   "tools": tools, **self.special_tokens}
        try:
            return self.template.render(context)
        except ChatTemplateError:
            raise
        except Exception as exc:  # the model's template run on the request's messages and variables: not a 500
            raise ChatTemplateError(f"the chat template failed on these messages: {type(exc).__name__}: {exc}"
                                    ) from exc
