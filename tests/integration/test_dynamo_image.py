"""An image packaged `--with dynamo` runs as NVIDIA Dynamo's frontend and workers, each in its own container (as a
DynamoGraphDeployment runs it): a random tiny Llama's image, one frontend container and two worker containers on
the host's network, sharing only a discovery folder (Dynamo's file backend standing in for the operator's
Kubernetes one). The frontend finds the model card at the path the workers registered in a filesystem of its own;
the openai SDK gets chat, a stream and a named tool call through it, with the key the frontend's gate asks for (every
route but its probes refuses a request without it); each worker's HEALTHCHECK asks its status server and reports it
healthy."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI

from tests.integration.conftest import BASE_IMAGE
from tests.support.containers import docker, wait_healthy
from tests.support.net import free_port
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TAG = "mbuild-test/tiny-llama-dynamo:it"
KEY = "dynamo-image-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def image(docker_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    llama = make_tiny_llama(tmp_path_factory.mktemp("random-llama"), train_steps=0, seed=1)
    docker("rmi", "-f", TAG)
    out = tmp_path_factory.mktemp("dynamo-image")
    result = mbuild("package", str(llama), "--precision", "fp32", "--with", "dynamo", "--backend", "docker",
                    "--base-image", BASE_IMAGE, "--name", TAG.split(":")[0], "--version", "it", "--output", str(out))
    assert result.returncode == 0, result.stderr
    yield TAG
    docker("rmi", "-f", TAG)


def _run(image: str, discovery: Path, *command: str, env: tuple[str, ...] = ()) -> str:
    flags = [f"-e={e}" for e in ("DYN_FILE_KV=/discovery", "MBUILD_THREADS=1", *env)]
    result = docker("run", "-d", "--network", "host", "-v", f"{discovery}:/discovery", *flags,
                    "--entrypoint", "python3", image, "-m", *command, *PLANES)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _low_port() -> int:
    """A free port Dynamo takes as DYN_SYSTEM_PORT: it reads it as a signed 16-bit number, below the ephemeral
    range free_port() draws from."""
    for port in random.sample(range(20000, 32000), 50):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise AssertionError("no free port in 20000..32000")


@pytest.fixture(scope="module")
def frontend(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    discovery = tmp_path_factory.mktemp("discovery")
    discovery.chmod(0o777)  # the image's user writes its registrations there
    port = free_port()
    containers = [_run(image, discovery, "runtimes.dynamo", env=(f"DYN_SYSTEM_PORT={_low_port()}",))
                  for _ in range(2)]
    containers.append(_run(image, discovery, "runtimes.dynamo.frontend", "--http-port", str(port),
                           "--router-mode", "kv", env=(f"MBUILD_API_KEY={KEY}",)))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2, headers=AUTH).json()["data"]:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(docker("logs", c).stderr[-1500:] for c in containers)
                raise AssertionError(f"the model never appeared behind the frontend\n{logs}")
            time.sleep(1)
        yield url, containers[:2]
    finally:
        for container in containers:
            docker("rm", "-f", container)


def test_chat_stream_and_a_tool_call_through_the_frontend(frontend: tuple[str, list[str]]) -> None:
    url, _ = frontend
    with OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as client:
        name = client.models.list().data[0].id
        messages: Any = [{"role": "user", "content": "Weather in Oslo?"}]
        chat = client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
        assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 8
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=name, messages=messages, max_tokens=8, temperature=0, stream=True) if c.choices]
        assert "".join(pieces) == chat.choices[0].message.content
        choice: Any = {"type": "function", "function": {"name": "get_weather"}}
        reply = client.chat.completions.create(model=name, messages=messages, tools=TOOLS, tool_choice=choice,
                                               temperature=0, max_tokens=60)
        calls = reply.choices[0].message.tool_calls or []
        assert reply.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]


def test_each_workers_healthcheck_asks_its_status_server(frontend: tuple[str, list[str]]) -> None:
    _, workers = frontend
    for worker in workers:
        wait_healthy(worker, timeout=120)


def test_the_frontend_asks_for_the_key_on_every_route_but_its_probes(frontend: tuple[str, list[str]]) -> None:
    url, _ = frontend
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/busy_threshold"),
                         ("GET", "/openapi.json")):
        got = httpx.request(method, f"{url}{path}", json={}, timeout=10)
        assert got.status_code == 401 and got.json()["error"]["code"] == "invalid_api_key", (path, got.text[:200])
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{url}/live", timeout=10).status_code == 200
