"""TLS from MBUILD_SSL_CERTFILE / MBUILD_SSL_KEYFILE, with a certificate made here by openssl."""

from __future__ import annotations

import os
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from openai import DefaultHttpxClient, OpenAI

from tests.support.procs import MBUILD, served

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_https_serves_with_the_given_certificate(tiny_build: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    env = {"MBUILD_SSL_CERTFILE": str(cert), "MBUILD_SSL_KEYFILE": str(key), "MBUILD_API_KEY": "k"}
    with served(tiny_build, env=env, ca=cert) as url:
        assert url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        with OpenAI(base_url=f"{url}/v1", api_key="k", http_client=DefaultHttpxClient(verify=trust)) as client:
            model = client.models.list().data[0].id
            assert len(client.embeddings.create(model=model, input="over TLS").data[0].embedding) > 0
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP on the TLS port is refused
            httpx.get(url.replace("https://", "http://") + "/v1/health/live", timeout=5)


def test_a_missing_key_file_stops_the_start(tiny_build: Path, certificate: tuple[Path, Path], tmp_path: Path) -> None:
    env = {"MBUILD_SSL_CERTFILE": str(certificate[0]), "MBUILD_SSL_KEYFILE": str(tmp_path / "absent.pem")}
    result = subprocess.run([*MBUILD, "serve", str(tiny_build), "--port", "1"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, **env}, check=False)
    assert result.returncode != 0
    assert "MBUILD_SSL_KEYFILE" in result.stderr and "Traceback" not in result.stderr
