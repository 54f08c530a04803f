"""Completion, chat and tool-call ids never repeat, whoever seeds Python's global random, and forked workers
do not mint the parent's ids."""

from __future__ import annotations

import os
import random

from runtimes.ids import hex_id


def test_seeding_the_global_random_does_not_repeat_ids() -> None:
    random.seed(7)
    first = hex_id()
    random.seed(7)
    assert hex_id() != first
    assert len(first) == 32 and int(first, 16) >= 0
    assert len(hex_id(24)) == 24


def test_a_forked_worker_mints_other_ids_than_its_parent() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the worker: send its next id and leave
        os.write(write, hex_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    theirs = os.read(read, 64).decode()
    os.close(read)
    assert len(theirs) == 32 and theirs != hex_id()
