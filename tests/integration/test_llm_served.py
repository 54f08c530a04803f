"""A served language model on a real HTTP server: a client that goes away frees its sequence."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import served

pytestmark = pytest.mark.slow


def running(url: str) -> int:
    text = httpx.get(f"{url}/v1/metrics").text
    found = re.search(r"^mbuild_running_sequences (\d+)", text, re.M)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnected_client_frees_its_sequence(tiny_llm_build: Path, stream: bool) -> None:
    # 64 sequences of 480 tokens: seconds of work even for the tiny model, so the client leaves mid-way.
    body = {"prompt": ["The quick brown fox"] * 16, "n": 4, "max_tokens": 480, "min_tokens": 480,
            "temperature": 0, "stream": stream}
    with served(tiny_llm_build) as url:
        if stream:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        break  # one chunk is enough: the sequence is running
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/completions", json=body, timeout=0.3)
        deadline = time.monotonic() + 10
        while running(url) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running(url) == 0  # long before 64 x 480 tokens would have been decoded
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=30)
        assert ok.status_code == 200
