"""Image backends, listed in BACKENDS. To add one: implement ImageBackend, add it here."""

from __future__ import annotations

from collections.abc import Callable

from builder.errors import InputError
from builder.image.base import ImageBackend, ImageResult
from builder.image.dockerfile_cli import BuildahBackend, DockerBackend, PodmanBackend
from builder.image.oci import OciBackend
from builder.oci.media import Format

# `--backend auto` tries them in this order: the tools the user already runs first, the writer last.
# Each factory takes the manifest format (only the OCI writer has a choice: the CLIs' is fixed) and whether
# the build is offline (no registry may be contacted for the base).
BACKENDS: dict[str, Callable[[Format, bool], ImageBackend]] = {
    "docker": lambda _fmt, offline: DockerBackend(offline),
    "podman": lambda _fmt, offline: PodmanBackend(offline),
    "buildah": lambda _fmt, offline: BuildahBackend(offline),
    "oci": OciBackend,
}
CHOICES = ("auto", "none", *BACKENDS)

__all__ = ["BACKENDS", "CHOICES", "ImageBackend", "ImageResult", "choose_backend"]


def choose_backend(name: str, image_format: Format = "oci", offline: bool = False
                   ) -> tuple[ImageBackend | None, str]:
    """The backend to build with (None: stop at the context) and a line saying why."""
    if name == "none":
        return None, "--backend none: stopping at the build context"
    if name == "auto":
        reasons = []
        for key, factory in BACKENDS.items():
            backend = factory(image_format, offline)
            refusal = backend.unavailable()
            if refusal is None:
                return backend, f"--backend auto chose {key}"
            reasons.append(f"{key}: {refusal.message}")
        return None, "no image backend available (" + "; ".join(reasons) + "); stopping at the build context"
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}", hint=f"choose one of {', '.join(CHOICES)}")
    backend = BACKENDS[name](image_format, offline)
    refusal = backend.unavailable()
    if refusal is not None:
        refusal.message = f"the {name} backend cannot build here: {refusal.message}"
        raise refusal
    return backend, f"building with {name}"
