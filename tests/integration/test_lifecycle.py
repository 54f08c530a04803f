"""The container's life: drains on SIGTERM without losing a request, runs read-only, stays small."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BASE_IMAGE
from tests.support.containers import docker, inspect, running, wait_healthy
from tests.support.runners import docker_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG_TEXTS = ["a fairly long sentence about containers and their health checks " * 12] * 8
LONG_INPUT = {"input": LONG_TEXTS, "truncate": "END"}


def test_stop_under_load_loses_no_request(minilm_image: str) -> None:
    """Clients behave like a load balancer: they stop sending once readiness says 503. Nothing sent fails."""
    outcomes: Counter[str] = Counter()
    lock, not_ready, done = threading.Lock(), threading.Event(), threading.Event()
    with running(minilm_image, "-e", "MBUILD_DRAIN_SECONDS=3") as (container, url):
        wait_healthy(container)

        def watch() -> None:
            with httpx.Client(timeout=5) as client:
                while not done.is_set():
                    try:
                        if client.get(f"{url}/v1/health/ready").status_code != 200:
                            break
                    except httpx.HTTPError:
                        break
                    time.sleep(0.05)
            not_ready.set()

        def load() -> None:
            with httpx.Client(timeout=60) as client:
                while not not_ready.is_set() and not done.is_set():
                    try:
                        code = str(client.post(f"{url}/v1/embeddings", json=LONG_INPUT).status_code)
                    except httpx.HTTPError as exc:
                        code = type(exc).__name__
                    with lock:
                        outcomes[code] += 1

        threads = [threading.Thread(target=watch)] + [threading.Thread(target=load) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        started = time.monotonic()
        stop = docker("stop", "--time", "30", container)
        took = time.monotonic() - started
        done.set()
        for thread in threads:
            thread.join(timeout=60)
        assert stop.returncode == 0
        state = inspect(container, "container")["State"]
    print(f"\nstop under load: {dict(outcomes)} in {took:.1f}s, exit {state['ExitCode']}")
    assert outcomes["200"] > 8
    assert set(outcomes) == {"200"}, f"failed requests: {dict(outcomes)}"
    assert state["ExitCode"] == 0
    assert took >= 3  # readiness went 503 first and the server kept serving through the drain


def test_in_flight_requests_finish_when_the_stop_comes_at_once(minilm_image: str) -> None:
    results: list[str] = []
    with running(minilm_image, "-e", "MBUILD_DRAIN_SECONDS=0") as (container, url):
        wait_healthy(container)

        def slow_request() -> None:
            big = {"input": LONG_TEXTS * 12, "truncate": "END"}
            try:
                results.append(str(httpx.post(f"{url}/v1/embeddings", json=big, timeout=120).status_code))
            except httpx.HTTPError as exc:
                results.append(type(exc).__name__)

        threads = [threading.Thread(target=slow_request) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both are in the server now
        assert docker("stop", "--time", "60", container).returncode == 0
        for thread in threads:
            thread.join(timeout=120)
        assert inspect(container, "container")["State"]["ExitCode"] == 0
    assert results == ["200", "200"]


def test_runs_with_a_read_only_root_filesystem(minilm_image: str) -> None:
    with docker_run(minilm_image, "--read-only", "--tmpfs", "/tmp") as url:
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "hi"}, timeout=30).status_code == 200
    assert inspect(minilm_image)["Config"]["User"] == "10001:10001"


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_size_above_the_base_is_within_budget(minilm_image: str, image_build: Path) -> None:
    """At most 1.5x the runtime's installed packages plus the model files (issue 3/7's budget)."""
    above = int(inspect(minilm_image)["Size"]) - int(inspect(BASE_IMAGE)["Size"])
    budget = _tree_bytes(image_build / "site") + _tree_bytes(image_build / "model")
    print(f"\nabove base: {above / 1e6:.1f} MB; packages + model: {budget / 1e6:.1f} MB; "
          f"ratio {above / budget:.3f}")
    assert above <= 1.5 * budget
