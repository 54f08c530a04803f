"""Bad-input corpora against a served model: the case shape, how a case is sent, the server's memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import psutil
from fastapi.testclient import TestClient

from runtimes.api.errors import Shape, shape_of

KEY = "reliability-key"
# A served model, or the app in-process (tests/unit/runtimes/api/test_hostile_corpus.py): starlette's TestClient
# is httpx2's.
Client = httpx.Client | TestClient
Response = httpx.Response | httpx2.Response
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # "{model}" is replaced by the served model name
    body: Any  # dict/list: JSON; bytes: raw; None: no body
    status: int | tuple[int, ...]  # the status a user must see (a tuple: any of these)
    method: str = "POST"
    headers: tuple[tuple[str, str | bytes], ...] = (("Authorization", f"Bearer {KEY}"),)
    names: str = ""  # a word the error message must hold (the field at fault)

    def allows(self, status: int) -> bool:
        return status in (self.status if isinstance(self.status, tuple) else (self.status,))


def j(**fields: Any) -> dict[str, Any]:
    return fields


def noauth(case: Case) -> Case:
    return Case(case.name, case.path, case.body, case.status, case.method, (), case.names)


def check(case: Case, got: Response) -> str | None:
    """What is wrong with the answer a user got, if anything."""
    status, kind = got.status_code, got.headers.get("content-type", "")
    if not case.allows(status):
        return f"status {status} (wanted {case.status}): {got.text[:300]}"
    if status < 300:
        if case.method == "GET":
            return None
        if "text/event-stream" in kind:
            complete = got.text.rstrip().endswith("data: [DONE]") and '"error"' not in got.text
            return None if complete else f"a broken stream: {got.text[-300:]}"
        body = got.json()
        wanted = case.body.get("n", 1) if isinstance(case.body, dict) else 1
        if "error" in body or ("choices" in body and len(body["choices"]) != wanted):
            return f"a 200 that is not a correct answer: {got.text[:300]}"
        return None
    try:
        error = got.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"status {status} without a JSON error: {got.text[:200]!r}"
    v2 = shape_of(case.path) is Shape.V2  # the server's own rule for which API's error shape a path gets
    if v2 and not (isinstance(error, str) and error):
        return f'a V2 error must be {{"error": "..."}}: {got.text[:200]}'
    if not v2 and not (isinstance(error, dict) and all(isinstance(error.get(k), str) and error[k]
                                                       for k in ("message", "type", "code"))):
        return f'an OpenAI error must be {{"error": {{"message", "type", "code"}}}}: {got.text[:200]}'
    message = error if isinstance(error, str) else error["message"]
    return f"the error does not name {case.names!r}: {message[:200]}" if case.names not in message else None


def served_model(client: Client, url: str) -> str:
    return str(client.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"])


def send(client: Client, url: str, case: Case, model: str, timeout: float | None = 60) -> Response:
    """timeout None: the client's own (starlette's TestClient takes none)."""
    path = case.path.replace("{model}", model)
    headers = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in case.headers]
    content = case.body if isinstance(case.body, bytes) else None if case.body is None else json.dumps(
        case.body).encode()
    if content is not None:
        headers.append((b"Content-Type", b"application/json"))
    limit: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    return client.request(case.method, url + path, content=content, headers=headers, **limit)


def server_rss(url: str) -> int:
    """Resident bytes of the process listening on url's port and all its children."""
    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            root = psutil.Process(conn.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    return 0
