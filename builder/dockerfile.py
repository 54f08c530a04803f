"""Render templates/Dockerfile.j2: sandboxed jinja2, StrictUndefined, quoting filters.

The template gets one frozen object (DockerfileContext), never loose arguments; values that come
from users or model repos (labels, names) can only land inside quoted strings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from builder.errors import InputError
from builder.resources import resource_dir

_LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
# name[:tag][@digest], registry host and port allowed; nothing a shell or Dockerfile could split on.
_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:]*(@sha256:[a-f0-9]{64})?$")


@dataclass(frozen=True)
class DockerfileContext:
    base_image: str
    labels: dict[str, str]
    model_id: str
    mbuild_version: str
    port: int = 8000
    uid: int = 10001
    extra: dict[str, str] = field(default_factory=dict)


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


def comment(value: object) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(resource_dir("templates"))),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters.update(quote=quote, label_key=label_key, image_ref=image_ref, comment=comment, tojson=json.dumps)
    return env


def render_dockerfile(ctx: DockerfileContext, template: str = "Dockerfile.j2") -> str:
    return _environment().get_template(template).render(ctx=ctx)
