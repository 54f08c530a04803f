"""Bad-input corpora against a served model: the case shape, how a case is sent, the server's memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

KEY = "reliability-key"
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


def served_model(client: httpx.Client, url: str) -> str:
    return str(client.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"])


def send(client: httpx.Client, url: str, case: Case, model: str, timeout: float = 60) -> httpx.Response:
    path = case.path.replace("{model}", model)
    headers = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in case.headers]
    content = case.body if isinstance(case.body, bytes) else None if case.body is None else json.dumps(
        case.body).encode()
    if content is not None:
        headers.append((b"Content-Type", b"application/json"))
    return client.request(case.method, url + path, content=content, headers=headers, timeout=timeout)


def server_rss(url: str) -> int:
    """Resident bytes of the process listening on url's port and all its children."""
    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            root = psutil.Process(conn.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    return 0
