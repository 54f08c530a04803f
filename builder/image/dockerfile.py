"""Render templates/Dockerfile.j2: sandboxed jinja2, StrictUndefined, quoting filters.

The template gets one frozen object (ImageSpec), never loose arguments; values that come from
users or model repos (labels, names) can only land inside quoted strings.
"""

from __future__ import annotations

import json
import re

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from builder.errors import InputError
from builder.image.spec import ImageSpec
from builder.resources import resource_dir

_LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
# name[:tag][@digest], registry host and port allowed; nothing a shell or Dockerfile could split on.
_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:]*(@sha256:[a-f0-9]{64})?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")


def quote(value: object) -> str:
    """A Dockerfile double-quoted string: no newlines, no variable expansion, escaped quotes."""
    text = re.sub(r"[\x00-\x1f\x7f]", " ", str(value))
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{text}"'


def label_key(value: object) -> str:
    if not _LABEL_KEY.match(str(value)):
        raise InputError(f"label key {value!r} may hold only lowercase letters, digits, '.', '-' and '_'")
    return str(value)


def image_ref(value: object) -> str:
    if not _IMAGE_REF.match(str(value)) or len(str(value)) > 255:
        raise InputError(f"base image {value!r} is not a valid image reference",
                         hint="e.g. python:3.11-slim, registry.example.com:5000/base/python:3.11")
    return str(value)


def env_key(value: object) -> str:
    if not _ENV_KEY.match(str(value)):
        raise InputError(f"environment variable name {value!r} is not valid")
    return str(value)


def path(value: object) -> str:
    """A build-context or image path (or a signal name): plain characters only, nothing to quote."""
    if not _PATH.match(str(value)) or ".." in str(value).split("/"):
        raise InputError(f"path {value!r} may hold only letters, digits, '.', '_', '-' and '/'")
    return str(value)


def exec_form(value: object) -> str:
    """A JSON array, as Dockerfile exec form wants it."""
    return json.dumps([str(v) for v in value])  # type: ignore[attr-defined]


def comment(value: object) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(resource_dir("templates"))),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters.update(quote=quote, label_key=label_key, image_ref=image_ref, comment=comment, env_key=env_key,
                       path=path, exec_form=exec_form)
    return env


def render_dockerfile(spec: ImageSpec, template: str = "Dockerfile.j2") -> str:
    return _environment().get_template(template).render(spec=spec)
