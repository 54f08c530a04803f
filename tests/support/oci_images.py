"""Tiny images made at test time: layers, OCI layouts, docker-save archives, and a registry on loopback."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from builder.oci.layout import Layout, canonical
from builder.oci.media import OCI_CONFIG, OCI_LAYER, OCI_MANIFEST

PYTHON_BIN = {"usr/local/bin/python3": b"#!elf", "usr/local/bin/python3.11": b"#!elf"}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_bytes(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A tar with these regular files and symlinks (name -> target), names exactly as given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


def gzip_layer(files: dict[str, bytes]) -> bytes:
    return gzip.compress(tar_bytes(files), mtime=0)


def image_docs(layers: list[dict[str, bytes]]) -> tuple[bytes, list[bytes], bytes]:
    """(config, gzipped layers, manifest) for an image whose layers hold these files."""
    raw = [tar_bytes(files) for files in layers]
    gz = [gzip.compress(r, mtime=0) for r in raw]
    config = canonical({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/local/bin:/usr/bin"]},
                        "rootfs": {"type": "layers", "diff_ids": [sha(r) for r in raw]}, "history": []})
    manifest = canonical({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                          "config": {"mediaType": OCI_CONFIG, "digest": sha(config), "size": len(config)},
                          "layers": [{"mediaType": OCI_LAYER, "digest": sha(g), "size": len(g)} for g in gz]})
    return config, gz, manifest


def make_layout(root: Path, layers: list[dict[str, bytes]] | None = None, tag: str = "base") -> Layout:
    config, gz, manifest = image_docs(layers if layers is not None else [PYTHON_BIN])
    layout = Layout(root)
    layout.put_bytes(config, OCI_CONFIG)
    for blob in gz:
        layout.put_bytes(blob, OCI_LAYER)
    layout.write_index(layout.put_bytes(manifest, OCI_MANIFEST), tag)
    return layout


def docker_archive(path: Path, manifest: list[dict[str, Any]], files: dict[str, bytes],
                   links: dict[str, str] | None = None) -> Path:
    """A `docker save`-shaped tar with this manifest.json (written as given, hostile or not)."""
    path.write_bytes(tar_bytes({"manifest.json": json.dumps(manifest).encode(), **files}, links))
    return path


@dataclass
class FakeRegistry:
    """Serves manifests and blobs under /v2/NAME/; an optional Bearer challenge names `realm`."""

    manifests: dict[str, bytes] = field(default_factory=dict)  # reference (tag or digest) -> bytes
    blobs: dict[str, bytes] = field(default_factory=dict)
    realm: str | None = None
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization header)
    uploads: dict[str, bytes] = field(default_factory=dict)  # upload id -> bytes so far
    port: int = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serve(self, name: str, config: bytes, gz: list[bytes], manifest: bytes, tag: str = "1") -> str:
        self.blobs.update({sha(config): config, **{sha(g): g for g in gz}})
        self.manifests.update({tag: manifest, sha(manifest): manifest})
        return f"{self.host}/{name}:{tag}"


def _handler(registry: FakeRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, head: bool) -> None:
            registry.seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/token"):
                return self._send(200, json.dumps({"token": "t0ken"}).encode(), "application/json", head)
            if registry.realm and self.headers.get("Authorization") != "Bearer t0ken":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="{registry.realm}",service="test"')
                self.send_header("Content-Length", "0")
                return self.end_headers()
            if self.path.rstrip("/") == "/v2":
                return self._send(200, b"{}", "application/json", head)
            kind, _, ref = self.path.rpartition("/")
            table = registry.manifests if kind.endswith("/manifests") else registry.blobs
            if ref not in table:
                return self._send(404, b"{}", "application/json", head)
            media = OCI_MANIFEST if kind.endswith("/manifests") else "application/octet-stream"
            self._send(200, table[ref], media, head)

        def _send(self, code: int, body: bytes, media: str, head: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":  # skopeo streams layers chunked
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data

        def do_POST(self) -> None:  # http.server names its handlers so
            upload = f"u{len(registry.uploads)}"
            registry.uploads[upload] = b""
            self.send_response(202)
            self.send_header("Location", f"{self.path.split('?')[0]}{upload}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PATCH(self) -> None:
            upload = self.path.split("?")[0].rsplit("/", 1)[-1]
            registry.uploads[upload] += self._body()
            self.send_response(202)
            self.send_header("Location", self.path.split("?")[0])
            self.send_header("Range", f"0-{len(registry.uploads[upload]) - 1}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self) -> None:
            path, _, query = self.path.partition("?")
            body = self._body()
            if "/manifests/" in path:
                registry.manifests[path.rsplit("/", 1)[-1]] = registry.manifests[sha(body)] = body
                digest = sha(body)
            else:
                data = registry.uploads.pop(path.rsplit("/", 1)[-1], b"") + body
                digest = dict(pair.split("=", 1) for pair in query.split("&") if "=" in pair)["digest"]
                digest = digest.replace("%3A", ":")
                if sha(data) != digest:
                    return self._send(400, b"{}", "application/json", False)
                registry.blobs[digest] = data
            self.send_response(201)
            self.send_header("Docker-Content-Digest", digest)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

    return Handler


@contextmanager
def fake_registry() -> Iterator[FakeRegistry]:
    registry = FakeRegistry()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(registry))
    registry.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
