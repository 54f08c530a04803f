"""The 8-bit KV cache on the real engine: the tiny Llama trained on a short text (tests/support/tiny_models.py: its
predictions are decisive, so a cache that lost what it holds would change them, while rounding within a scale does
not). Its default build (int8 weights) keeps an int8 cache, calibrated on its own fp32 cache and gated; the same
profile told to keep fp32 builds the engine it is compared with. Greedy output must equal the fp32 cache's token for
token, with a quarter of its bytes; a cache whose scales fail the gate is taken out, the pool keeping its bytes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from builder.build.plan_package import PackageOptions, plan_package
from builder.engine import kv_cache_quant
from builder.engine.kv_cache_quant import fp32_cache_graph, quantize_graph
from builder.engine.make import make_engine
from builder.planning.memory import kv_pool_bytes, memory_need
from builder.planning.plan import BuildPlan
from builder.progress import Reporter
from runtimes.bundle import load_engine_config
from runtimes.bundle.engine import KV_BLOCK_TOKENS
from runtimes.bundle.report import REPORT_FILE, DecoderReport, read_gate_report
from runtimes.engines.decoder import DecoderEngine
from tests.unit.runtimes.api.test_generation_service import serving

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


def _plan(model: Path, out: Path, kv_cache: str | None = None) -> BuildPlan:
    """The default plan for `model`, its profile told to keep `kv_cache` where given."""
    plan = plan_package(PackageOptions(model=str(model), output=out, backend="none"), Reporter(quiet=True))
    if kv_cache is None:
        return plan
    profile = plan.profile.model_copy(update={"engine_options": {**plan.profile.engine_options, "kv_cache": kv_cache}})
    return dataclasses.replace(plan, profile=profile, need=memory_need(plan.facts, profile))


def _built(plan: BuildPlan, model: Path, out: Path) -> tuple[Path, DecoderReport]:
    engine_dir, build_dir = out / "engine", out / "build"
    build_dir.mkdir(parents=True)
    report = make_engine(plan, model, out / "work", engine_dir, build_dir, Reporter(quiet=True))
    assert isinstance(report, DecoderReport)
    return engine_dir, report


@pytest.fixture(scope="module")
def fp32_cache_engine(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default profile's engine, told to keep an fp32 cache: the same weights as the default build."""
    out = tmp_path_factory.mktemp("fp32-cache")
    return _built(_plan(tiny_llama, out / "plan", "fp32"), tiny_llama, out)[0]


def _engine(model_dir: Path) -> DecoderEngine:
    return DecoderEngine(model_dir, load_engine_config(model_dir), threads=1, slots=1)


def test_the_default_build_s_int8_cache_decodes_as_the_fp32_one_in_a_quarter_of_the_bytes(
        tiny_llm_build: Path, fp32_cache_engine: Path) -> None:
    plain, quantized = _engine(fp32_cache_engine), _engine(tiny_llm_build / "model")
    assert (plain.kv_dtype, quantized.kv_dtype) == (np.float32, np.int8)
    assert quantized.bytes_per_token * 4 == plain.bytes_per_token
    tokenizer = Tokenizer.from_file(str(fp32_cache_engine / "tokenizer.json"))
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


def test_taking_the_int8_cache_out_gives_back_the_fp32_graph(tiny_llm_build: Path, fp32_cache_engine: Path,
                                                             tmp_path: Path) -> None:
    """A build that shipped int8 made to keep fp32 again (what the benchmarks compare it with): the same graph as
    the profile's fp32-cache build, and the same logits."""
    folder = tmp_path / "engine"
    shutil.copytree(tiny_llm_build / "model", folder)
    fp32_cache_graph(folder / "model.onnx")
    restored = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    want = onnx.load(str(fp32_cache_engine / "model.onnx"), load_external_data=False)
    assert restored.graph.SerializeToString() == want.graph.SerializeToString()
    prompt = np.array([[1, 5, 9, 14]], np.int64)
    plain = _engine(fp32_cache_engine).run(0, prompt)
    assert _engine(folder).kv_dtype == np.float32
    np.testing.assert_array_equal(_engine(folder).run(0, prompt), plain)


def test_the_rewrite_refuses_scales_that_do_not_match_the_graph(fp32_cache_engine: Path, tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    shutil.copy(fp32_cache_engine / "model.onnx", model)
    before = model.read_bytes()
    with pytest.raises(ValueError, match="attention nodes"):
        quantize_graph(model, [np.ones((2, 1, 16), np.float32)] * 3)
    assert model.read_bytes() == before  # nothing written
    assert onnx.load(str(model), load_external_data=False).graph.input[4].type.tensor_type.elem_type == 1


def test_the_default_build_gates_both_caches_and_plans_the_pool_at_a_byte_a_value(tiny_llama: Path,
                                                                                   tiny_llm_build: Path,
                                                                                   tmp_path: Path) -> None:
    plan = _plan(tiny_llama, tmp_path / "out")
    assert plan.need.kv_cache_gb * 4 == pytest.approx(_plan(tiny_llama, tmp_path / "fp32", "fp32").need.kv_cache_gb)
    model = tiny_llm_build / "model"
    report = read_gate_report(json.loads((model / REPORT_FILE).read_text()))
    assert isinstance(report, DecoderReport) and report.passed and report.kv_cache == "int8"
    assert report.fp32_cache is not None and report.fp32_cache.top1_agreement >= plan.profile.tolerance.min_top1
    assert report.int8_cache is None and "int8 KV cache; fp32 cache: top-1" in report.summary
    config = load_engine_config(model)
    assert config.batching.kv_cache_bytes == kv_pool_bytes(plan.facts, plan.profile)
    assert config.batching.kv_cache_bytes == (config.batching.max_batch * config.max_seq_length
                                              * _engine(model).bytes_per_token)  # every slot's whole context


def test_an_int8_cache_that_fails_the_gate_is_taken_out_and_the_pool_keeps_its_bytes(
        tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scales at a hundredth of what the calibration text reached saturate nearly every key and value: the gate
    fails that cache, and the build ships the fp32 one (not an error) within the memory planned for int8."""
    monkeypatch.setattr(kv_cache_quant, "HEADROOM", 0.01)
    plan = _plan(tiny_llama, tmp_path / "out")
    engine_dir, report = _built(plan, tiny_llama, tmp_path)
    assert report.passed and report.kv_cache == "fp32" and report.fp32_cache is None
    assert report.int8_cache is not None and report.int8_cache.top1_agreement < plan.profile.tolerance.min_top1
    assert "an int8 one failed the gate" in report.summary
    assert read_gate_report(json.loads((engine_dir / REPORT_FILE).read_text())) == report
    engine = _engine(engine_dir)
    assert engine.kv_dtype == np.float32  # the fp32 graph is back
    planned = kv_pool_bytes(plan.facts, plan.profile)
    assert load_engine_config(engine_dir).batching.kv_cache_bytes == planned
    with serving(engine_dir, served_name="tiny") as client:
        found = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
                 for s in f.samples}
    tokens = planned // (KV_BLOCK_TOKENS * engine.bytes_per_token) * KV_BLOCK_TOKENS
    assert found["mbuild_kv_cache_capacity_tokens"] == tokens
    assert tokens * 4 == plan.profile.limits.max_batch * load_engine_config(engine_dir).max_seq_length
