"""`mbuild bench` checks the workload against the model's context before any load. The default chat preset (1k in,
1k out) on a model of a smaller context was a 400 for every request, and the user read "All 16 inference
request(s) failed ... check the server URL". A build's context is read from its engine.json before it is served;
a served model's (an image's, a URL's) from its /v1/metadata."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.procs import mbuild, served


def _context(build: Path) -> int:
    return int(json.loads((build / "model" / "engine.json").read_text())["max_seq_length"])


def _says_what_fits(stderr: str, context: int) -> None:
    assert f"holds {context} tokens of context, so every request would be refused" in stderr, stderr
    suggested = re.search(r"hint: pass lengths that fit, e\.g\. --isl (\d+) --osl (\d+)", stderr)
    assert suggested, stderr
    assert int(suggested.group(1)) + int(suggested.group(2)) < context  # room left for the chat template


def test_a_build_the_chat_preset_overflows_is_refused_before_it_is_served(tiny_llm_build: Path,
                                                                          tmp_path: Path) -> None:
    context = _context(tiny_llm_build)
    assert context < 2048  # the preset's 1024 in + 1024 out cannot fit
    out = tmp_path / "out"
    result = mbuild("bench", str(tiny_llm_build), "-o", str(out))
    assert result.returncode == 2 and "the chat workload asks 1024 tokens in and 1024 out" in result.stderr
    _says_what_fits(result.stderr, context)
    assert not out.exists()  # refused before anything was written or served


def test_a_served_model_is_checked_by_what_its_metadata_says(tiny_llm_build: Path, tmp_path: Path) -> None:
    context = _context(tiny_llm_build)
    with served(tiny_llm_build) as url:
        result = mbuild("bench", url, "-o", str(tmp_path / "out"), "--osl", str(context))
    assert result.returncode == 2, result.stderr
    _says_what_fits(result.stderr, context)
    assert not (tmp_path / "out" / "aiperf").exists()  # no load was sent
