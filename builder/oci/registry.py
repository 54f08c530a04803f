"""A small client for the OCI distribution API: pull and push manifests and blobs.

Auth: anonymous, Basic, or Bearer tokens from the registry's WWW-Authenticate challenge, with
credentials from MBUILD_REGISTRY_USERNAME/PASSWORD or the docker config (~/.docker/config.json).
Plain HTTP is used for localhost and 127.0.0.1, or any host in MBUILD_INSECURE_REGISTRIES.
Credentials go only to a token realm over https on the registry's own host, Docker Hub's auth host,
or a host named in MBUILD_REGISTRY_AUTH_HOSTS; plain HTTP only where the realm's host is insecure too.
Manifests fetched by digest and every blob are checked against their digest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import httpx

from builder.errors import ImageBuildError, InputError, UnsafeInput
from builder.oci.digests import DIGEST, checked, of_bytes
from builder.oci.media import ACCEPT
from builder.oci.refs import DOCKER_HUB, ImageRef
from builder.settings import host_settings

_CHUNK = 1 << 20


def _docker_config_auth(registry: str) -> tuple[str, str] | None:
    config_dir = host_settings().docker_config
    try:
        auths = json.loads((config_dir / "config.json").read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys += ["https://index.docker.io/v1/", "docker.io"]
    for key in keys:
        encoded = auths.get(key, {}).get("auth")
        if encoded:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
            return user, password
    return None


def credentials(registry: str) -> tuple[str, str] | None:
    settings = host_settings()
    user, password = settings.registry_username, settings.registry_password
    if user and password:
        return user, password
    return _docker_config_auth(registry)


def is_insecure(registry: str) -> bool:
    host = registry.split(":")[0]
    extra = host_settings().insecure_registries
    return host in {"localhost", "127.0.0.1", "::1"} or registry in extra or host in extra


def trusted_realm(registry: str, realm: str) -> bool:
    """May this token realm see the registry's credentials? Its host must be the registry's or named."""
    url = httpx.URL(realm)
    host, netloc = url.host, url.netloc.decode()
    known = {registry.split(":")[0], registry} | host_settings().registry_auth_hosts
    if registry == DOCKER_HUB:
        known.add("auth.docker.io")
    if host not in known and netloc not in known:
        return False
    return url.scheme == "https" or (url.scheme == "http" and is_insecure(netloc))


class Registry:
    def __init__(self, ref: ImageRef, timeout: float = 60) -> None:
        self.ref = ref
        scheme = "http" if is_insecure(ref.registry) else "https"
        self.base = f"{scheme}://{ref.registry}/v2/{ref.name}"
        self.creds = credentials(ref.registry)
        self.client = httpx.Client(timeout=timeout, follow_redirects=True)
        self.auth_header: str | None = None

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.creds:
                raise ImageBuildError(f"{self.ref.registry} wants a login",
                                      hint="docker login, or set MBUILD_REGISTRY_USERNAME and MBUILD_REGISTRY_PASSWORD")
            self.auth_header = "Basic " + base64.b64encode(":".join(self.creds).encode()).decode()
            return
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {k: v for k, v in fields.items() if k in {"service", "scope"}}
        realm = fields.get("realm", "")
        try:
            trusted = trusted_realm(self.ref.registry, realm)
        except httpx.InvalidURL as exc:
            raise UnsafeInput(f"{self.ref.registry} names a token realm that is not a URL: {realm!r}") from exc
        if self.creds and not trusted:
            raise UnsafeInput(f"{self.ref.registry} asks for credentials at {realm!r}, which is not an https address "
                              "on the registry's host; mbuild does not send them there",
                              hint="if that host is the registry's real token service, name it in "
                                   "MBUILD_REGISTRY_AUTH_HOSTS (it must use https unless it is local)")
        if not realm.startswith(("https://", "http://")):
            raise UnsafeInput(f"{self.ref.registry} names a token realm that is not http(s): {realm!r}")
        try:
            reply = self.client.get(realm, params=query, auth=self.creds if trusted else None)
        except httpx.HTTPError as exc:
            raise ImageBuildError(f"cannot reach {self.ref.registry}'s token service {realm}: {exc}") from exc
        if reply.status_code != 200:
            raise ImageBuildError(f"{self.ref.registry} refused a token (HTTP {reply.status_code})",
                                  hint="check the registry credentials (docker login or MBUILD_REGISTRY_*)")
        try:
            body = reply.json()
        except ValueError as exc:
            raise ImageBuildError(f"{self.ref.registry}'s token service answered something other than JSON") from exc
        self.auth_header = "Bearer " + (body.get("token") or body.get("access_token", ""))

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}) or {})
        for attempt in range(2):
            if self.auth_header:
                headers["Authorization"] = self.auth_header
            try:
                response = self.client.request(method, url, headers=headers, **kwargs)
            except httpx.HTTPError as exc:
                hint = "check the address; plain-HTTP registries go in MBUILD_INSECURE_REGISTRIES"
                raise ImageBuildError(f"cannot reach the registry {self.ref.registry}: {exc}", hint=hint) from exc
            if response.status_code == 401 and attempt == 0 and "www-authenticate" in response.headers:
                self._authenticate(response.headers["www-authenticate"])
                continue
            return response
        return response

    def _check(self, response: httpx.Response, what: str) -> httpx.Response:
        if response.status_code >= 400:
            detail = response.read().decode(errors="replace")[:300].strip()
            if response.status_code in {401, 403}:
                raise ImageBuildError(f"{what}: the registry denied access (HTTP {response.status_code})",
                                      hint="docker login, or set MBUILD_REGISTRY_USERNAME and MBUILD_REGISTRY_PASSWORD")
            if response.status_code == 404:
                raise InputError(f"{what}: not found in {self.ref.registry} ({detail})")
            raise ImageBuildError(f"{what}: HTTP {response.status_code} {detail}")
        return response

    # --- pull ---------------------------------------------------------------------------
    def get_manifest(self, reference: str) -> tuple[bytes, str, str]:
        response = self._check(self.request("GET", f"{self.base}/manifests/{reference}",
                                            headers={"Accept": ACCEPT}), f"manifest {self.ref}")
        data = response.content
        digest = of_bytes(data)
        if DIGEST.match(reference) and digest != reference:
            raise UnsafeInput(f"{self.ref.registry} answered manifest {reference} with other bytes ({digest})",
                              hint="the registry or something between it and this host altered the image")
        media = response.headers.get("content-type", "").split(";")[0]  # else the manifest's own mediaType
        return data, media, digest

    def get_blob(self, digest: str, dest: Path) -> None:
        checked(digest, f"blob from {self.ref.registry}")
        sha = hashlib.sha256()
        tmp = dest.with_suffix(".partial")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        self.request("HEAD", f"{self.base}/blobs/{digest}")  # answers any auth challenge before streaming
        headers = {"Authorization": self.auth_header} if self.auth_header else {}
        with self.client.stream("GET", f"{self.base}/blobs/{digest}", headers=headers) as response:
            self._check(response, f"blob {digest[:19]}")
            with tmp.open("wb") as out:
                for chunk in response.iter_bytes(_CHUNK):
                    sha.update(chunk)
                    out.write(chunk)
        if "sha256:" + sha.hexdigest() != digest:
            tmp.unlink()
            raise UnsafeInput(f"blob {digest} from {self.ref.registry} does not match its digest",
                              hint="the registry or something between it and this host altered the image")
        tmp.rename(dest)

    # --- push ---------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self.request("HEAD", f"{self.base}/blobs/{digest}").status_code == 200

    def push_blob(self, path: Path, digest: str) -> None:
        if self.has_blob(digest):
            return
        start = self._check(self.request("POST", f"{self.base}/blobs/uploads/"), "start upload")
        location = start.headers["location"]
        if location.startswith("/"):
            location = self.base.split("/v2/")[0] + location
        separator = "&" if "?" in location else "?"
        with path.open("rb") as body:
            self._check(self.request("PUT", f"{location}{separator}digest={digest}", content=body,
                                     headers={"Content-Type": "application/octet-stream",
                                              "Content-Length": str(path.stat().st_size)}),
                        f"upload blob {digest[:19]}")

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> str:
        response = self._check(self.request("PUT", f"{self.base}/manifests/{reference}", content=data,
                                            headers={"Content-Type": media_type}), f"push manifest {self.ref}")
        return response.headers.get("docker-content-digest") or "sha256:" + hashlib.sha256(data).hexdigest()
