"""A fixed CPU host for golden output: /proc's answers replaced at their one edge."""

from __future__ import annotations

import pytest

from builder.planning import target as target_module

CPU_FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512bw", "sse4_2"})  # an AVX-512 host without VNNI


def pin_cpu_host(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str] = CPU_FLAGS, ram_gb: float = 64.0,
                 cores: int = 16) -> None:
    monkeypatch.setattr(target_module, "read_cpu_flags", lambda: flags)
    monkeypatch.setattr(target_module, "read_ram_gb", lambda: ram_gb)
    monkeypatch.setattr(target_module, "cpu_count", lambda: cores)
    monkeypatch.setattr(target_module, "detect_gpus", lambda: ())
