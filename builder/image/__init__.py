"""Image backends, listed in BACKENDS. To add one: implement ImageBackend, add it here."""

from __future__ import annotations

from collections.abc import Callable

from builder.errors import ImageBuildError, InputError
from builder.image.base import ImageBackend, ImageResult
from builder.image.docker import DockerBackend
from builder.image.oci import OciBackend

# `--backend auto` tries them in this order: a daemon the user already runs first, the writer last.
BACKENDS: dict[str, Callable[[], ImageBackend]] = {
    "docker": DockerBackend,
    "oci": OciBackend,
}
CHOICES = ("auto", "none", *BACKENDS)

__all__ = ["BACKENDS", "CHOICES", "ImageBackend", "ImageResult", "choose_backend"]


def choose_backend(name: str) -> tuple[ImageBackend | None, str]:
    """The backend to build with (None: stop at the context) and a line saying why."""
    if name == "none":
        return None, "--backend none: stopping at the build context"
    if name == "auto":
        reasons = []
        for key, factory in BACKENDS.items():
            backend = factory()
            why = backend.why_unavailable()
            if not why:
                return backend, f"--backend auto chose {key}"
            reasons.append(f"{key}: {why}")
        return None, "no image backend available (" + "; ".join(reasons) + "); stopping at the build context"
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}", hint=f"choose one of {', '.join(CHOICES)}")
    backend = BACKENDS[name]()
    why = backend.why_unavailable()
    if why:
        raise ImageBuildError(f"the {name} backend cannot build here: {why}",
                              hint="start the engine (or set DOCKER_HOST), or use --backend none for the context")
    return backend, f"building with {name}"
