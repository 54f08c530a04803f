"""TensorRT builder settings for each precision and profile kind (pure, no TensorRT needed)."""

from __future__ import annotations

import json

import pytest

from builder.engine.expected_io import expected_export
from builder.engine.tensorrt_settings import TrtSettings, trt_settings
from builder.errors import InputError
from builder.model.catalog import lookup_alias
from builder.planning.profiles import load_profiles
from runtimes.bundle import EngineMeta

PROFILES = {p.name: p for p in load_profiles()}
LLAMA = lookup_alias("llama-3.1-8b").facts()  # type: ignore[union-attr]
MINILM = lookup_alias("all-minilm-l6-v2").facts()  # type: ignore[union-attr]


def settings(name: str, facts=LLAMA) -> TrtSettings:  # type: ignore[no-untyped-def]
    return trt_settings(PROFILES[name], facts.task, expected_export(facts), "9.0")


@pytest.mark.parametrize(("precision", "flags", "typed", "explicit"), [
    ("fp16", ("FP16",), False, None),
    ("bf16", ("BF16",), False, None),
    ("fp8", (), True, "fp8"),
    ("int8", (), True, "int8"),
])
def test_precision_flags(precision: str, flags: tuple[str, ...], typed: bool, explicit: str | None) -> None:
    s = settings(f"tensorrt-h100-{precision}-tp1-latency")
    assert (s.build.precision_flags, s.build.strongly_typed, s.explicit_quantization) == (flags, typed, explicit)


def test_nvfp4_is_explicit_and_only_on_blackwell() -> None:
    s = trt_settings(PROFILES["tensorrt-b200-nvfp4-tp1-throughput"], "text-generation", expected_export(LLAMA), "10.0")
    assert s.build.strongly_typed and s.explicit_quantization == "nvfp4"
    assert "tensorrt-h100-nvfp4-tp1-throughput" not in PROFILES


def test_embeddings_get_one_profile_over_batch_and_sequence() -> None:
    s = settings("tensorrt-h100-fp16-tp1-latency", MINILM)
    assert len(s.build.profiles) == 1
    ids = s.build.profiles[0]["input_ids"]
    assert (ids.min, ids.max) == ((1, 1), (PROFILES["tensorrt-h100-fp16-tp1-latency"].limits.max_batch, 256))
    assert set(s.build.profiles[0]) == {"input_ids", "attention_mask", "token_type_ids"}


def test_language_models_get_prefill_and_decode_profiles() -> None:
    profile = PROFILES["tensorrt-h100-bf16-tp1-throughput"]
    prefill, decode = settings(profile.name).build.profiles
    context, batch = profile.limits.context or 0, profile.limits.max_batch
    assert prefill["input_ids"].max == (batch, context) and prefill["past.0.key"].max == (batch, 8, 0, 128)
    assert decode["input_ids"].max == (batch, 1)
    assert decode["past.31.value"].min == (1, 8, 1, 128) and decode["past.31.value"].max == (batch, 8, context - 1, 128)
    assert decode["attention_mask"].max == (batch, context)


def test_workspace_and_level_from_the_profile() -> None:
    s = settings("tensorrt-h100-fp16-tp1-latency").build
    assert s.workspace_bytes == 8 * (1 << 30) and s.optimization_level == 3
    assert s.hardware_compatibility == "NONE" and not s.version_compatible


def test_the_build_settings_round_trip_through_their_contract() -> None:
    """What build_plan is told at package time is what engine-meta.json gives a build at start."""
    s = settings("tensorrt-h100-bf16-tp1-throughput")
    meta = EngineMeta(tensorrt_version="10.13.0", compute_capability="9.0", device_name="NVIDIA H100",
                      gpu_model="h100", profile="p", build=s.build, timing_cache_sha256="0" * 64)
    assert EngineMeta.from_dict(json.loads(json.dumps(meta.to_dict()))).build == s.build
    assert s.to_dict()["build"] == meta.to_dict()["build"]


def test_bad_compatibility() -> None:
    odd = PROFILES["tensorrt-h100-fp16-tp1-latency"].model_copy(
        update={"engine_options": {"hardware_compatibility": "everything"}})
    with pytest.raises(InputError, match="hardware_compatibility"):
        trt_settings(odd, "text-generation", expected_export(LLAMA), "9.0")
