"""Silence the ML libraries' own progress bars and tracer warnings; mbuild reports progress itself."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from transformers.utils import logging as hf_logging


@contextmanager
def quiet_ml() -> Iterator[None]:
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        # torch.onnx's TracerWarnings describe trace-time constants in transformers' masking code,
        # which the numerical gate checks for real; they would only alarm users.
        warnings.simplefilter("ignore")
        yield
