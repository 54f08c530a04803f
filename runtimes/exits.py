"""The container's exit codes, defined once: the entry point and the PID 1 supervisor both return them."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    BROKEN_BUNDLE = 3  # the model folder, its engine or tokenizer, or a setting is unusable; or it failed to load
    WRONG_HARDWARE = 4  # the profile needs a CPU feature, GPU or memory this host lacks
