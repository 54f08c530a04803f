"""Issue 58: multi-head latent attention (DeepSeek-V3's) is cached as its latent and shared rotary key
(builder/engine/generic/latent.py), kv_lora_rank + qk_rope_head_dim values a token and layer, held once as keys and
values, not every head's key and value; kv_b_proj is absorbed into the query and the output, and the engine still
matches transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtimes.bundle import REPORT_FILE, load_engine_config, read_gate_report
from runtimes.bundle.engine import DecoderOptions
from runtimes.engines.decoder import DecoderEngine
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

pytestmark = pytest.mark.slow


def test_a_deepseek_v3_shaped_model_caches_its_latent_and_matches_transformers(tmp_path: Path) -> None:
    model = make_tiny_llama(tmp_path / "deepseek", train_steps=0, family="deepseek_v3")
    config = json.loads((model / "config.json").read_text())
    out = tmp_path / "out"
    result = mbuild("package", str(model), "--backend", "none", "--gpu", "cpu", "--precision", "fp32",
                    "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    options = load_engine_config(out / "model").options
    assert isinstance(options, DecoderOptions)
    assert (options.kv_heads, options.head_dim) == (1, config["kv_lora_rank"] + config["qk_rope_head_dim"])
    assert options.head_dim < config["num_attention_heads"] * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    graph = onnx.load(str(out / "model" / "model.onnx"), load_external_data=False).graph
    weights = {name for node in graph.node for name in node.input if "kv_b_proj" in name}
    assert weights == {"model.layers.0.self_attn.kv_b_proj.weight.absorbed0",
                       "model.layers.0.self_attn.kv_b_proj.weight.absorbed1",
                       "model.layers.1.self_attn.kv_b_proj.weight.absorbed0",
                       "model.layers.1.self_attn.kv_b_proj.weight.absorbed1"}  # absorbed, never a linear layer
    report = read_gate_report(json.loads((out / "model" / REPORT_FILE).read_text()))
    assert report.passed and "greedy decode equal to transformers on 4/4" in report.verdict
    # the latent is the keys and the values: one buffer a layer, bound as both, counted once by the KV pool
    engine = DecoderEngine(out / "model", load_engine_config(out / "model"), slots=2)
    assert all(engine.cache[2 * i] is engine.cache[2 * i + 1] for i in range(engine.layers))
    assert engine.bytes_per_token == engine.layers * options.head_dim * 4
    first = engine.run(0, np.array([[5, 6, 7, 8]], np.int64))
    engine.write(1, engine.read(0, 3), 3)  # the prefix cache's copy of 3 positions, a block a layer
    assert len(engine.read(0, 3)) == engine.layers
    assert np.allclose(engine.run(1, np.array([[8]], np.int64)), first, atol=1e-5)  # served from the copy
