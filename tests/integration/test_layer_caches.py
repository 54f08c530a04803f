"""Issue 58: models whose layers' KV caches differ in shape (a model whose global layers have heads of their own
size, transformers' per_layer_config) are exported with each layer's cache, served with each layer's buffers,
counted per layer by the KV pool and planned per layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from builder.model.shape import facts_from_config
from builder.planning.memory import kv_bytes_per_token, kv_bytes_per_value
from builder.planning.profiles import load_profiles
from runtimes.bundle import REPORT_FILE, ContractError, load_engine_config, read_gate_report
from runtimes.bundle.codec import decode, encode
from runtimes.bundle.engine import DecoderOptions, LayerCache
from runtimes.engines.decoder import DecoderEngine
from tests.support.procs import mbuild
from tests.support.tiny_models import make_tiny_llama

MIXED = "gemma4_text"  # a type whose tiny config gives its global layer a head size of its own


def _options(layers: int, caches: tuple[LayerCache, ...]) -> DecoderOptions:
    return DecoderOptions(vocab_size=8, layers=layers, kv_heads=2, head_dim=16, eos_token_ids=(2,),
                          special_tokens={}, chat_template=None, layer_caches=caches)


def test_engine_json_names_only_the_layers_that_differ() -> None:
    options = _options(3, (LayerCache(1, 4, 32),))
    assert options.cache_shapes == ((2, 16), (4, 32), (2, 16))
    assert decode(DecoderOptions, encode(options), "engine.json") == options
    assert "layer_caches" not in {k for k, v in encode(_options(3, ())).items() if v}  # a uniform file as before
    with pytest.raises(ContractError, match="layer_caches"):
        _options(3, (LayerCache(3, 4, 32),))


def test_the_plan_counts_each_layers_cache(tmp_path: Path) -> None:
    """config.json's per_layer_config, or the fields its config class derives it from, sizes each layer's cache."""
    folder = make_tiny_llama(tmp_path / "model", train_steps=0, family=MIXED)
    config = json.loads((folder / "config.json").read_text())
    overrides = {int(i): entry for i, entry in config["per_layer_config"].items()}
    assert any("head_dim" in entry for entry in overrides.values())
    facts = facts_from_config(config, "text-generation")
    shapes = [(int(overrides.get(i, {}).get("num_key_value_heads", config["num_key_value_heads"])),
               int(overrides.get(i, {}).get("head_dim", config["head_dim"])))
              for i in range(config["num_hidden_layers"])]
    assert list(facts.layer_caches) == shapes and len(set(shapes)) > 1
    profile = load_profiles()[0]
    assert kv_bytes_per_token(facts, profile) == 2 * sum(h * d for h, d in shapes) * kv_bytes_per_value(profile)
    # a config.json saved before per_layer_config (the type's global layers' field): the class derives it
    legacy = {**{k: v for k, v in config.items() if k != "per_layer_config"}, "global_head_dim": max(shapes)[1]}
    assert facts_from_config(legacy, "text-generation").layer_caches == facts.layer_caches


@pytest.mark.slow
def test_a_model_with_mixed_caches_builds_serves_and_matches_transformers(tmp_path: Path) -> None:
    folder = make_tiny_llama(tmp_path / "model", train_steps=0, family=MIXED)
    out = tmp_path / "out"
    result = mbuild("package", str(folder), "--backend", "none", "--gpu", "cpu", "--precision", "fp32",
                    "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_gate_report(json.loads((out / "model" / REPORT_FILE).read_text()))
    assert report.passed and "greedy decode equal to transformers on 4/4" in report.verdict
    config = load_engine_config(out / "model")
    shapes = config.decoder.cache_shapes
    assert len(set(shapes)) > 1 and config.decoder.layer_caches
    engine = DecoderEngine(out / "model", config, slots=2)
    assert [(b.shape[1], b.shape[3]) for b in engine.cache] == [s for s in shapes for _ in (0, 1)]
    assert engine.bytes_per_token == 2 * sum(h * d for h, d in shapes) * 4
    engine.run(0, np.array([[5, 6, 7, 8]], np.int64))
    blocks = engine.read(0, 4)  # the prefix cache's copy, one block per layer and kind, in its shape
    engine.write(1, blocks, 4)
    assert all(np.array_equal(b[0, :, :4], b[1, :, :4]) for b in engine.cache)
    after = engine.run(0, np.array([[9]], np.int64)), engine.run(1, np.array([[9]], np.int64))
    assert np.allclose(after[0], after[1], atol=1e-5)  # the copied prefix serves as the computed one
