"""The matmul_rows benchmark (bench/scenarios/matmul_rows.py) at its quick size: every kernel runs the model's own
matrices, and the report shows each one's rows beside its one-row pass."""

from __future__ import annotations

import json
from pathlib import Path

from bench.lib.llm_models import LLAMA_TINY
from bench.lib.verify_cost import macs_per_token, matrices
from bench.scenarios import matmul_rows
from runtimes.hardware import read_cpu_flags


def test_the_lm_head_is_the_last_matrix_and_the_layers_repeat() -> None:
    shape = {**LLAMA_TINY, "vocab_size": 700}
    found = matrices(shape)
    assert found[-1] == (LLAMA_TINY["hidden_size"], 700)
    assert len(found) == 4 * LLAMA_TINY["num_hidden_layers"] + 1
    assert macs_per_token(shape) == sum(k * n for k, n in found)


def test_a_quick_run_times_every_kernel_at_every_row_count(tmp_path: Path) -> None:
    report = matmul_rows.main(quick=True, out=tmp_path)
    data = json.loads((tmp_path / "matmul_rows.json").read_text())
    arms = matmul_rows.arms_here()
    flags = read_cpu_flags()
    # mbuild's tiles kernel where the CPU has VNNI; its VNNI-only arm where the kernel would otherwise use AMX
    assert any("tiles" in arm for arm in arms) == ({"avx512bw", "avx512_vnni"} <= flags)
    assert any(arm.endswith("VNNI") for arm in arms) == ("amx_int8" in flags and "avx512_vnni" in flags)
    assert sorted(data["ms"]) == sorted(arms)
    for arm, cells in data["ms"].items():
        assert set(cells) == {str(r) for r in matmul_rows.QUICK_ROWS}
        assert all(ms > 0 for ms in cells.values()), arm
    assert data["macs_per_row"] == macs_per_token({**LLAMA_TINY, "vocab_size": 512})
    text = report.read_text()
    for arm in arms:
        assert f"| {arm} | " in text
    assert "(1.00x)" in text  # each kernel's one-row pass against itself
