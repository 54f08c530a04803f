"""Identifiers the server mints: request ids, completion ids, tool-call ids."""

from __future__ import annotations

import random


def hex_id(chars: int = 32) -> str:
    """`chars` random hex digits. Not uuid4: its os.urandom call releases the GIL, and under load the engine's
    thread takes it for a step before this one gets it back (2.5 ms a request at one stream, measured with
    py-spy). The ids name things and guard nothing, so a non-cryptographic source is enough; `random` reseeds
    in forked workers."""
    return f"{random.getrandbits(4 * chars):0{chars}x}"
