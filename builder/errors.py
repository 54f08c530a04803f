"""One exception family for everything a user can get wrong or meet.

Each error carries what went wrong, what to do about it, and its exit code. The CLI maps
them to stderr and the exit status in one place; nothing else prints tracebacks.
"""

from __future__ import annotations


class MbuildError(Exception):
    """Base class: a message for the user, an optional hint, an exit code."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class InputError(MbuildError):
    """A malformed argument or file the user gave us."""

    exit_code = 2


class ModelNotFound(MbuildError):
    exit_code = 3


class AccessDenied(MbuildError):
    """Gated or private repository without a usable token."""

    exit_code = 4


class HubUnreachable(MbuildError):
    exit_code = 5


class NotInCache(MbuildError):
    """Offline, and the model is not in the local Hugging Face cache."""

    exit_code = 6


class UnsupportedModel(MbuildError):
    exit_code = 7


class ValidationFailed(MbuildError):
    """The compiled engine does not match the reference within tolerance."""

    exit_code = 8


class ToolMissing(MbuildError):
    """An optional build-time dependency or external program is not installed."""

    exit_code = 9


class ImageBuildError(MbuildError):
    exit_code = 10


class StorageMismatch(ImageBuildError):
    """containers-storage was set up with another graph driver than the one podman is asked to use."""

    exit_code = 11


class OutputUnusable(MbuildError):
    """The build directory cannot be written, or holds files mbuild did not write."""

    exit_code = 12


class PortBusy(MbuildError):
    exit_code = 13


class BaseImageError(MbuildError):
    """The base image is missing, unreadable, or has no Python the runtime can use."""

    exit_code = 14


class UnsafeInput(MbuildError):
    """An input failed a safety check: a path leaving its folder, a digest that does not match its bytes,
    credentials asked for by a host mbuild does not trust."""

    exit_code = 15


class BenchFailed(MbuildError):
    """`mbuild bench`: the target cannot be reached or never got ready, or the load generator failed."""

    exit_code = 16


class SloUnmet(MbuildError):
    """`mbuild bench --slo`: no measured point meets the objective (the sweep and its report are kept)."""

    exit_code = 17
