"""Calls into transformers' Python side made in a child process, where this process has not imported PyTorch.

Reading a config through transformers' config classes imports PyTorch (their modules import modeling_rope_utils,
which imports torch): ~0.33 GiB resident that never goes back. The build's own process needs none of it (the
export runs in a child, builder/engine/export_worker.py), so planning a model the generic export builds would hold
that beside the export's child for nothing: a generic Cohere's build peaked at 1.07 GiB, 0.40 of it the build's
own process (the fast lane's: 0.07). A process that has PyTorch already (the export, the tests, the sweep) calls
in place. Arguments and results are JSON either way, so both give the same values.
"""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from builder import errors

F = TypeVar("F", bound=Callable[..., Any])


def _plain(value: Any) -> Any:
    """What a JSON round trip gives (tuples as lists, keys as strings, anything else as its str)."""
    return json.loads(json.dumps(value, default=str))


def torch_free(fn: F) -> F:
    """fn, called in a child process while this one has not imported torch; each result kept per arguments."""
    kept: dict[str, Any] = {}

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        key = json.dumps(args, sort_keys=True, default=str)
        if key not in kept:
            kept[key] = _plain(fn(*args)) if "torch" in sys.modules else _in_child(fn, key)
        return kept[key]

    return call  # type: ignore[return-value]


def _in_child(fn: Callable[..., Any], args: str) -> Any:
    child = subprocess.run([sys.executable, "-m", __name__, f"{fn.__module__}:{fn.__qualname__}"], input=args,
                           text=True, capture_output=True, check=False)
    if child.returncode == 0:
        return json.loads(child.stdout)
    try:
        failure = json.loads(child.stdout)
    except json.JSONDecodeError:
        failure = None
    if isinstance(failure, dict) and "error" in failure:
        kind = getattr(errors, failure["error"], errors.MbuildError)
        raise kind(failure["message"], hint=failure["hint"])
    tail = "\n".join(child.stderr.strip().splitlines()[-15:])
    raise RuntimeError(f"{fn.__qualname__} ended with status {child.returncode} in its child process:\n{tail}")


def main(where: str) -> int:
    module, _, name = where.partition(":")
    call = getattr(importlib.import_module(module), name).__wrapped__
    try:
        result = call(*json.loads(sys.stdin.read()))
    except errors.MbuildError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}))
        return 1
    except Exception:
        traceback.print_exc()
        return 70
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
