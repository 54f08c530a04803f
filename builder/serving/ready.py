"""Waiting for a server that was just started to serve: one loop for everything that starts a runtime and must know
when it is up (`mbuild bench`'s targets, `mbuild serve --replicas`, the benchmarks in bench/).

It asks a route until the answer passes a check, a watched process ends, or time runs out, and says which of the
three happened; each caller turns that into its own error."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import httpx

from runtimes.health import READY

Poll = Callable[[], int | None]  # a process's exit status once it has ended, else None (Popen.poll)
Check = Callable[[httpx.Response], bool]
MODELS = "/v1/models"  # OpenAI's model list: what a server without mbuild's READY answers


class Outcome(StrEnum):
    READY = "ready"
    ENDED = "ended"  # a watched process ended first
    TIMED_OUT = "timed out"


@dataclass(frozen=True)
class Readiness:
    outcome: Outcome
    ended: int | None = None  # ENDED: which of the watched processes (its index in `watch`)
    returncode: int | None = None  # ENDED: its exit status


def answers_200(response: httpx.Response) -> bool:
    return response.status_code == 200


def lists_model(name: str | None = None) -> Check:
    """An OpenAI model list that holds `name` (any model where None): Dynamo's frontend answers before its workers
    have registered the model, and serves nothing until they have."""
    def check(response: httpx.Response) -> bool:
        body = response.json()
        listed = body.get("data") if isinstance(body, dict) else None
        return isinstance(listed, list) and any(
            isinstance(model, dict) and (name is None or model.get("id") == name) for model in listed)
    return check


def wait_ready(url: str, within_s: float, *, watch: Sequence[Poll] = (), paths: Sequence[str] = (READY,),
               check: Check = answers_200, api_key: str | None = None, every_s: float = 0.5,
               ask_s: float = 2.0) -> Readiness:
    """Ask `url` until `check` passes on the answer of the first of `paths` the server has (any answer but a 404
    decides: READY, then MODELS for a server without it), one of `watch` ends, or `within_s` runs out.
    every_s: the pause between tries; ask_s: one request's time limit."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for n, poll in enumerate(watch):
            code = poll()
            if code is not None:
                return Readiness(Outcome.ENDED, n, code)
        if _passes(url, paths, check, headers, ask_s):
            return Readiness(Outcome.READY)
        time.sleep(every_s)
    return Readiness(Outcome.TIMED_OUT)


def _passes(url: str, paths: Sequence[str], check: Check, headers: dict[str, str], ask_s: float) -> bool:
    try:
        for n, path in enumerate(paths):
            response = httpx.get(url + path, timeout=ask_s, headers=headers)
            if response.status_code != 404 or n == len(paths) - 1:
                return check(response)
    except (httpx.HTTPError, ValueError):  # not listening yet, or an answer that is not the JSON expected
        pass
    return False
