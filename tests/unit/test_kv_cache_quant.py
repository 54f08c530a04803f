"""The 8-bit KV cache on the real engine: the tiny Llama trained on a short text (tests/support/tiny_models.py: its
predictions are decisive, so a cache that lost what it holds would change them, while rounding within a scale does
not), its int8 engine's graph rewritten to keep int8 keys and values with scales calibrated on its own cache.
Greedy output must equal the fp32 cache's token for token, with a quarter of its bytes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from tokenizers import Tokenizer

from builder.build.plan_package import PackageOptions, plan_package
from builder.engine.kv_cache_quant import calibrate, quantize_graph
from builder.engine.make import make_engine
from builder.planning.memory import memory_need
from builder.progress import Reporter
from runtimes.bundle import load_engine_config
from runtimes.bundle.report import REPORT_FILE, DecoderReport, read_gate_report
from runtimes.engines.decoder import DecoderEngine
from tests.support.tiny_models import TRAINING_TEXT

PROMPTS = ["The quick brown fox", "Containers package software with", "def add(a, b):", "Hello, world! How are you",
           "I am a tiny"]
NEW = 64


def _greedy(engine: DecoderEngine, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """NEW greedy tokens after the prompt, and the logits each was picked from."""
    logits = engine.run(0, np.array([prompt], np.int64))
    made, seen = [], []
    for _ in range(NEW):
        seen.append(logits[-1])
        made.append(int(np.argmax(logits[-1])))
        logits = engine.run(0, np.array([[made[-1]]], np.int64))
    engine.release(0)
    return made, np.stack(seen)


def test_an_int8_cache_decodes_as_the_fp32_one_in_a_quarter_of_the_bytes(tiny_llm_build: Path,
                                                                         tmp_path: Path) -> None:
    fp32_dir = tiny_llm_build / "model"
    int8_dir = tmp_path / "model"
    shutil.copytree(fp32_dir, int8_dir)
    tokenizer = Tokenizer.from_file(str(fp32_dir / "tokenizer.json"))
    calibration = [tokenizer.encode(line).ids for line in TRAINING_TEXT.split(". ")]
    scales = calibrate(int8_dir, calibration, threads=1)
    quantize_graph(int8_dir / "model.onnx", scales)
    config = load_engine_config(fp32_dir)
    plain, quantized = (DecoderEngine(d, config, threads=1, slots=1) for d in (fp32_dir, int8_dir))
    assert (plain.kv_dtype, quantized.kv_dtype) == (np.float32, np.int8)
    assert quantized.bytes_per_token * 4 == plain.bytes_per_token
    worst = margin = 0.0
    for text in PROMPTS:
        prompt = tokenizer.encode(text).ids
        want, want_logits = _greedy(plain, prompt)
        got, got_logits = _greedy(quantized, prompt)
        assert got == want, text
        worst = max(worst, float(np.abs(got_logits - want_logits).max()))
        margin = max(margin, float(np.ptp(want_logits, axis=1).max()))
    print(f"largest logit difference along the greedy path: {worst:.4f} (logits span up to {margin:.1f})")
    assert 0 < worst < 0.05 * margin  # the cache is rounded, and only rounded


def test_the_rewrite_refuses_scales_that_do_not_match_the_graph(tiny_llm_build: Path, tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    shutil.copy(tiny_llm_build / "model" / "model.onnx", model)
    before = model.read_bytes()
    with pytest.raises(ValueError, match="attention nodes"):
        quantize_graph(model, [np.ones((2, 1, 16), np.float32)] * 3)
    assert model.read_bytes() == before  # nothing written
    assert onnx.load(str(model), load_external_data=False).graph.input[4].type.tensor_type.elem_type == 1


def test_a_profile_asking_an_int8_cache_builds_it_gated_with_the_fp32_cache_s_numbers_beside(
        tiny_llama: Path, tmp_path: Path) -> None:
    """The build's own path (make_engine) under a profile whose engine_options say kv_cache: int8 (none of the
    built-in ones does yet): the fp32 cache gated, then the int8 one, the report holding both."""
    plan = plan_package(PackageOptions(model=str(tiny_llama), output=tmp_path / "out", backend="none"),
                        Reporter(quiet=True))
    profile = plan.profile.model_copy(update={"engine_options": {**plan.profile.engine_options, "kv_cache": "int8"}})
    need = memory_need(plan.facts, profile)
    assert need.kv_cache_gb * 4 == pytest.approx(plan.need.kv_cache_gb)  # the pool planned at a byte a value
    plan = dataclasses.replace(plan, profile=profile, need=need)
    engine_dir, build_dir = tmp_path / "engine", tmp_path / "build"
    build_dir.mkdir()
    report = make_engine(plan, tiny_llama, tmp_path / "work", engine_dir, build_dir, Reporter(quiet=True))
    assert isinstance(report, DecoderReport) and report.passed and report.kv_cache == "int8"
    assert report.fp32_cache is not None and report.fp32_cache.top1_agreement >= plan.profile.tolerance.min_top1
    assert "int8 KV cache; fp32 cache: top-1" in report.summary
    assert read_gate_report(json.loads((engine_dir / REPORT_FILE).read_text())) == report  # the contract holds it
    assert DecoderEngine(engine_dir, load_engine_config(engine_dir), threads=1, slots=1).kv_dtype == np.int8
