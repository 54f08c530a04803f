"""What an engine step's weight matrices cost at 1 to 64 rows, per kernel: the floor under a verify row and a batch.

A step multiplies rows (a decode row is one token; a verify row at one stream is the last token and its drafts; a
batch at 16 streams is 16 rows) by every weight matrix of the model. At one row a kernel is bound by reading the
weights; each further row adds its multiply-adds, at the kernel's compute rate. So how fast a kernel takes its
second to fifth row bounds what speculative decoding gives at one stream (bench/lib/verify_cost.py prices the
served engine's own rows), and its rate at 16 rows bounds a batch's step beside a peer's kernel.

The matrices: the ~100M Llama of the LLM benchmarks (llm_peer's shape: 12 layers of a fused q/k/v, o_proj, a fused
gate/up and down_proj, and the untied 32000-word LM head), random values, each arm one graph or loop of all of
them, so the weights come from memory as in a step. One thread on one pinned core; the median of CALLS calls a
round, rows and arms interleaved over the rounds. Arms:
  int8 mbuild tiles b128  what mbuild's int8 builds run on a VNNI CPU: its MatMulInt8Tiles
                          (runtimes/kernels/int8_tiles.cpp) on 8-bit blocks of 128, compiled here; on a core with
                          AMX it takes 10 rows or more on the tiles
  int8 mbuild tiles VNNI  the same kernel kept on VNNI (MBUILD_NO_AMX), run only where the core has AMX
  int8 MatMulNBits b128   ONNX Runtime's kernel for the same blocks (accuracy_level 4), what they ran before
  int4 MatMulNBits b128   mbuild's int4 builds
  int8 dynamic            ONNX Runtime's DynamicQuantizeMatMul on per-channel int8 weights (the AVX2 int8 profile)
  fp32 ONNX Runtime       its MatMul on prepacked fp32 weights, what mbuild's fp32 builds run
  fp32 torch, bf16 torch  torch.nn.functional.linear, the kernels vLLM's CPU build runs at --dtype float32/bfloat16
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.lib.harness import OUT, interleave, machine, write
from bench.lib.llm_models import LLAMA_100M, LLAMA_TINY
from bench.lib.matmul_kernels import kernel_session
from bench.lib.servers import pinned, split_cores
from bench.lib.verify_cost import macs_per_token, matrices
from runtimes.hardware import read_cpu_flags

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "a step's weight matrices at 1 to 64 rows, per kernel"

VOCAB = 32000
ROWS = (1, 2, 3, 5, 8, 9, 10, 12, 16, 64)
QUICK_ROWS = (1, 2)
CALLS = 20
ARMS = ("int8 mbuild tiles b128", "int8 mbuild tiles VNNI", "int8 MatMulNBits b128", "int4 MatMulNBits b128",
        "int8 dynamic", "fp32 ONNX Runtime", "fp32 torch", "bf16 torch")


def _arm(shapes: list[tuple[int, int]], arm: str, rng: np.random.Generator) -> Callable[[int], Callable[[], object]]:
    """The arm's weights, made once; given a row count, one pass over every matrix at that many rows."""
    def inputs(rows: int) -> dict[int, np.ndarray]:
        return {k: rng.standard_normal((rows, k), dtype=np.float32) for k, _ in shapes}
    if arm.endswith("torch"):
        import torch

        dtype = torch.bfloat16 if arm.startswith("bf16") else torch.float32
        weights = [(k, (torch.randn(n, k) * 0.02).to(dtype)) for k, n in shapes]

        def torch_pass(rows: int) -> Callable[[], object]:
            xs = {k: torch.from_numpy(x).to(dtype) for k, x in inputs(rows).items()}

            def run() -> None:
                with torch.inference_mode():
                    for k, w in weights:
                        torch.nn.functional.linear(xs[k], w)
            return run
        return torch_pass
    session = kernel_session(shapes, arm, rng)

    def ort_pass(rows: int) -> Callable[[], object]:
        feeds = {f"x{k}": x for k, x in inputs(rows).items()}
        return lambda: session.run(None, feeds)
    return ort_pass


def _median_ms(call: Callable[[], object]) -> float:
    call()
    spent = []
    for _ in range(CALLS):
        started = time.perf_counter()
        call()
        spent.append(time.perf_counter() - started)
    return float(np.median(spent)) * 1000


def _markdown(results: dict[str, Any], quick: bool) -> str:
    rows, ms, macs = results["rows"], results["ms"], results["macs_per_row"]
    lines = ["# An engine step's weight matrices at 1 to 64 rows, per kernel", "", (__doc__ or "").split("\n\n")[0], "",
             f"Command: `python -m bench matmul_rows --repeats {results['repeats']}`{' (quick)' if quick else ''}. "
             f"Machine: {results['machine']['cpu']}, {results['machine']['date']}; ONNX Runtime "
             f"{results['onnxruntime']}, torch {results['torch']}; {macs / 1e6:.1f} M multiply-adds a row.", "",
             "Median ms of one pass over every matrix (and x its own one-row pass):", "",
             "| kernel | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |",
             "| --- | " + " | ".join("---:" for _ in rows) + " |"]
    for arm in ms:
        lines.append(f"| {arm} | " + " | ".join(f"{ms[arm][str(r)]:.2f} ({ms[arm][str(r)] / ms[arm]['1']:.2f}x)"
                                             for r in rows) + " |")
    last = max(r for r in rows if r <= 5)
    lines += ["", "Each further row's multiply-adds: the rate rows 2 to "
              f"{last} ran at (their added time), and the rate at {rows[-1]} rows, G a second:", "",
              f"| kernel | rows 2-{last} | {rows[-1]} rows | one row x {next(iter(ms))}'s |",
              "| --- | ---: | ---: | ---: |"]
    default = next(iter(ms.values()))["1"]  # the default int8's, where this CPU runs it
    for arm, cells in ms.items():
        added = cells[str(last)] - cells["1"]
        rate = f"{macs * (last - 1) / added / 1e6:.0f}" if last > 1 and added > 0 else "-"
        lines.append(f"| {arm} | {rate} | {macs * rows[-1] / cells[str(rows[-1])] / 1e6:.0f} | "
                     f"{cells['1'] / default:.2f}x |")
    return "\n".join(lines) + "\n"


def arms_here() -> list[str]:
    """The arms this CPU runs: mbuild's tiles kernel needs AVX-512 BW and VNNI (it refuses other CPUs), and its
    VNNI-only arm differs from the default only where the core has AMX."""
    flags = read_cpu_flags()
    vnni = {"avx512bw", "avx512_vnni"} <= flags
    return [arm for arm in ARMS if (vnni or "tiles" not in arm) and (not arm.endswith("VNNI") or "amx_int8" in flags)]


def main(repeats: int = 3, quick: bool = False, out: Path = OUT) -> Path:
    """`python -m bench matmul_rows`: every arm at every row count, interleaved over `repeats` rounds."""
    import torch

    torch.set_num_threads(1)
    shape = {**(LLAMA_TINY if quick else LLAMA_100M), "vocab_size": 512 if quick else VOCAB}
    shapes = matrices(shape)
    rows = QUICK_ROWS if quick else ROWS
    rng = np.random.default_rng(0)
    kept = arms_here()
    with pinned({min(split_cores()[1])}):
        arms = {arm: _arm(shapes, arm, rng) for arm in kept}
        calls = {(arm, r): arms[arm](r) for arm in kept for r in rows}
        series = interleave([(f"{arm} x{r}", partial(_median_ms, call)) for (arm, r), call in calls.items()],
                            1 if quick else repeats)
    ms = {arm: {str(r): series[f"{arm} x{r}"].median for r in rows} for arm in kept}
    results = {"machine": machine(), "onnxruntime": ort.__version__, "torch": torch.__version__, "repeats": repeats,
               "rows": list(rows), "macs_per_row": macs_per_token(shape), "ms": ms}
    markdown = _markdown(results, quick)
    path = write("matmul_rows", results, markdown, out, measures=MEASURES)
    print(markdown)
    return path
