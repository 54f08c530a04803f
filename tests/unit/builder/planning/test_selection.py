"""Ranking rules and the no-profile error, on fixed targets."""

from __future__ import annotations

import pytest

from builder.model.catalog import lookup_alias
from builder.planning.profiles import load_profiles
from builder.planning.selection import NoProfile, require_selection, select
from builder.planning.target import Gpu, Target

FACTS_8B = lookup_alias("llama-3.1-8b").facts()  # type: ignore[union-attr]
FACTS_70B = lookup_alias("llama-3.1-70b").facts()  # type: ignore[union-attr]
MINILM = lookup_alias("all-minilm-l6-v2").facts()  # type: ignore[union-attr]
VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"})


def cpu(flags: frozenset[str] = VNNI, ram: float = 64) -> Target:
    return Target(kind="cpu", cpu_flags=flags, ram_gb=ram, cpu_count=8)


def gpus(model: str, cc: str, memory: float, count: int = 1) -> Target:
    return Target(kind="cuda", gpus=(Gpu(model, cc, memory),) * count)


def chosen(target: Target, facts=FACTS_8B, **asks: str) -> str:  # type: ignore[no-untyped-def]
    selection = select(load_profiles(), target, facts, **asks)  # type: ignore[arg-type]
    return require_selection(selection, target, "model").profile.name


def test_fp32_takes_the_portable_cpu_class_int8_the_most_specific() -> None:
    assert chosen(cpu(), MINILM) == "onnxruntime-cpu-fp32-tp1-latency"
    assert chosen(cpu(), MINILM, precision="int8") == "onnxruntime-cpu.vnni-int8-tp1-latency"


def test_throughput_takes_the_fewest_gpus_latency_the_most() -> None:
    eight = gpus("h100", "9.0", 80, 8)
    assert chosen(eight, FACTS_70B, mode="throughput") == "tensorrt-h100-fp8-tp2-throughput"
    assert chosen(eight, FACTS_70B, mode="latency") == "tensorrt-h100-fp8-tp8-latency"


def test_the_user_can_pin_precision_and_profile() -> None:
    h100 = gpus("h100", "9.0", 80)
    assert chosen(h100, precision="bf16") == "tensorrt-h100-bf16-tp1-throughput"
    assert chosen(h100, profile="tensorrt-h100-int8-tp1-latency") == "tensorrt-h100-int8-tp1-latency"


def test_a_profile_that_cannot_run_is_refused_with_why() -> None:
    with pytest.raises(NoProfile, match="tp2 needs 2 GPUs"):
        chosen(gpus("h100", "9.0", 80), profile="tensorrt-h100-fp8-tp2-latency")


def test_no_compatible_profile_names_the_nearest_miss() -> None:
    with pytest.raises(NoProfile) as info:
        chosen(gpus("l4", "8.9", 24), FACTS_70B)
    assert "nearest miss is tensorrt-l4-" in info.value.message and "needs >= " in info.value.message
    assert info.value.hint is not None and "--gpu" in info.value.hint


def test_a_cpu_without_avx2_gets_the_missing_flags_named() -> None:
    with pytest.raises(NoProfile, match="needs CPU flags avx2, fma"):
        chosen(cpu(frozenset({"sse4_2"})), MINILM)


def test_unknown_gpus_get_no_profile_but_a_reason() -> None:
    with pytest.raises(NoProfile, match="built for"):
        chosen(gpus("t4", "7.5", 16), MINILM)


def test_a_precision_that_failed_the_gate_is_passed_over_and_the_reason_says_so() -> None:
    first = select(load_profiles(), cpu(), FACTS_8B)
    assert first.selected is not None and first.selected.profile.precision == "int8"
    again = select(load_profiles(), cpu(), FACTS_8B, failed=frozenset({"int8"}))
    assert again.selected is not None and again.selected.profile.precision == "fp32"
    assert any("int8 failed it on this model" in line for line in again.why)
    assert select(load_profiles(), cpu(), FACTS_8B, failed=frozenset({"int8", "fp32"})).selected is None
