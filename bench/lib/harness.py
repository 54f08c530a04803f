"""Repeats with interleaved arms, medians with their spread, and the files a run writes."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.lib import page_header
from bench.lib.loadgen import Load

if TYPE_CHECKING:
    import onnx

OUT = page_header.DOCS
QUICK_OUT = Path(tempfile.gettempdir()) / "mbuild-bench-quick"  # `--quick` reports: a scratch folder, never OUT


def work_folder(name: str, quick: bool = False) -> Path:
    """Where a scenario keeps its models and builds between runs; a quick run's own, as its models differ."""
    return Path(tempfile.gettempdir()) / f"mbuild-bench-{name}{'-quick' if quick else ''}"


def skipped(arm: str, how: str) -> None:
    """The one line a quick run prints for a peer's arm it leaves out (a peer that takes long to build)."""
    print(f"  skipped {arm} (quick mode): {how}", flush=True)


@dataclass
class Series:
    """Repeated measurements of one arm in one case (higher is better unless stated)."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def spread(self, digits: int = 1) -> str:
        return f"{min(self.values):.{digits}f}-{max(self.values):.{digits}f}" if self.values else "-"


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values` (order statistics: the median lies between the j-th
    smallest and j-th largest with the binomial's probability); None where there are too few values for `level`."""
    ordered, count = sorted(values), len(values)
    tail, below, j = (1 - level) / 2, 0.0, 0
    while j < count and below + math.comb(count, j) / 2 ** count <= tail:
        below += math.comb(count, j) / 2 ** count
        j += 1
    return (ordered[j - 1], ordered[count - j]) if j else None


def interleave(cases: list[tuple[str, Callable[[], float]]], repeats: int,
               log: Callable[[str], None] = print) -> dict[str, Series]:
    """Run every case once per round, rounds `repeats` times, so drift hits all arms alike."""
    results = {name: Series() for name, _ in cases}
    for round_ in range(repeats):
        for name, run in cases:
            started = time.perf_counter()
            value = run()
            results[name].values.append(value)
            log(f"  round {round_ + 1}/{repeats} {name}: {value:.2f} ({time.perf_counter() - started:.1f}s)")
    return results


def machine() -> dict[str, Any]:
    """A run's record: the machine, the date, and the command and checkout it ran (its page's header says them)."""
    return {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), **page_header.run_record()}


def _cpu() -> str:
    """The CPU and its vector class: the machine a run lands on varies, and the int8 kernels (and so the profile the
    CPU defaults pick) follow the class."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    vector = ("AVX-512 VNNI and AMX" if {"avx512_vnni", "amx_int8"} <= flags
              else "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512, no VNNI" if "avx512f" in flags
              else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    return f"{platform.machine()}, {model}, {vector}"


def read_rate_gbs(size: int = 1 << 30, repeats: int = 5) -> float:
    """One core's sequential read rate in GB/s: the best of `repeats` numpy maxima over `size` bytes, on the calling
    thread's cores (a maximum streams faster than a sum here). No step that must read N bytes takes less than N over
    this; the best of several keeps that floor low on a machine whose bandwidth varies between runs."""
    data = np.ones(size // 4, np.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        data.max()
        best = min(best, time.perf_counter() - started)
    return size / best / 1e9


def best_gflops(call: Callable[[], object], flops: float, reps: int) -> float:
    """`flops` over the best of 3 timings of `reps` calls, in GFLOP/s, after one call to warm up."""
    call()
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(reps):
            call()
        best = max(best, flops * reps / (time.perf_counter() - started) / 1e9)
    return best


# Square matmuls and a Llama-3.2-1B MLP projection both ways at 512 rows: ONNX Runtime's peak is on the latter
PEAK_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (512, 2048, 8192), (512, 8192, 2048))


def matmul_model(weight: np.ndarray, rows: int | str) -> onnx.ModelProto:
    """An ONNX model of one MatMul, x [rows, K] times the constant `weight` [K, N] (an initializer, so ONNX Runtime
    prepacks it as it does an engine's weights)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fp32_peak_gflops(threads: int = 1, shapes: tuple[tuple[int, int, int], ...] = PEAK_SHAPES,
                     reps: int = 8) -> float:
    """The best rate of fp32 matmuls [M, K] x [K, N], torch's and ONNX Runtime's (its MatMul on a prepacked
    constant weight, as mbuild's engines run it), 3 timings per shape, on the calling thread's cores: the floor
    for dense math, so it takes the faster library on its best shape. No engine does N fp32 FLOPs in less than
    N over this."""
    import onnxruntime as ort
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        model = matmul_model(b.numpy(), m).SerializeToString()
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        best = max(best, best_gflops(partial(torch.mm, a, b), 2 * m * k * n, reps),
                   best_gflops(partial(session.run, None, {"x": a.numpy()}), 2 * m * k * n, reps))
    torch.set_num_threads(before)
    return best


def write(name: str, data: dict[str, Any], markdown: str, out: Path = OUT, *, measures: str,
          run: dict[str, Any] | None = None) -> Path:
    """name.json and name.md in `out`, the page with its header under its title: `measures` (one short line: the
    README's index shows it) and the run's record, `run` or else data's "machine" (harness.machine's)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path = out / f"{name}.md"
    path.write_text(page_header.with_header(markdown, page_header.for_run(measures, run or data.get("machine")
                                                                          or machine())))
    return path


def rate_row(arm: str, concurrency: int, series: Series, runs: list[Load], unit: str) -> dict[str, Any]:
    """A report's row for one arm at one concurrency: its rounds' rates of `unit` a second, their median, the
    requests timed, and the median of the rounds' p50 and p99."""
    return {"arm": arm, "concurrency": concurrency, f"{unit}_per_s": series.values,
            f"{unit}_per_s_median": series.median, "requests": sum(len(r.latencies) for r in runs),
            "p50_ms": float(np.median([r.p50_ms for r in runs])), "p99_ms": float(np.median([r.p99_ms for r in runs]))}
