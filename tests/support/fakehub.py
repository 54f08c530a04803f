"""A loopback stand-in for the Hugging Face Hub's HTTP API.

The real Hub cannot be reached from these machines, so this serves the handful of endpoints that
huggingface_hub's own client calls (model info, tree listing, file resolve) and the error headers
the Hub sends (RepoNotFound, GatedRepo, RevisionNotFound). The client code under test is the real one.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    folder: Path
    sha: str = field(default_factory=lambda: hashlib.sha1(b"fake").hexdigest())
    gated: bool = False

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- request handling -------------------------------------------------------------------
    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, body: bool) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        h.send_header("Content-Type", "application/json")
        payload = json.dumps({"error": code}).encode()
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _json(self, h: BaseHTTPRequestHandler, data: object, body: bool) -> None:
        payload = json.dumps(data).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _lookup(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str, body: bool) -> FakeRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 401, "RepoNotFound", body)
            return None
        if repo.gated and not h.headers.get("authorization"):
            self._error(h, 401, "GatedRepo", body)
            return None
        if rev not in {"main", repo.sha}:
            self._error(h, 404, "RevisionNotFound", body)
            return None
        return repo

    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            kind = parts[4] if len(parts) > 4 else "revision"
            rev = parts[5] if len(parts) > 5 else "main"
            repo = self._lookup(h, repo_id, rev, body)
            if repo is None:
                return
            if kind == "revision":
                self._json(h, {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                               "gated": repo.gated, "siblings": [{"rfilename": f} for f in repo.files()]}, body)
            else:  # tree listing
                self._json(h, [{"type": "file", "path": f, "size": (repo.folder / f).stat().st_size,
                                "oid": hashlib.sha1((repo.folder / f).read_bytes()).hexdigest()}
                               for f in repo.files()], body)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._lookup(h, "/".join(parts[:2]), parts[3], body)
            if repo is None:
                return
            file = repo.folder / "/".join(parts[4:])
            if not file.is_file():
                self._error(h, 404, "EntryNotFound", body)
                return
            data = file.read_bytes()
            h.send_response(200)
            h.send_header("X-Repo-Commit", repo.sha)
            h.send_header("ETag", '"' + hashlib.sha1(data).hexdigest() + '"')
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if body:
                h.wfile.write(data)
            return
        self._error(h, 404, "RepoNotFound", body)
