"""Which quantized kernels a CPU language-model profile should build with: decode-step time per precision.

One random ~100M Llama (bench/llm_models.py), exported by mbuild at fp32; ONNX Runtime's MatMulNBits
quantizer then writes int8 and int4 weights at accuracy_level 0 (the quantizer's default: weights
dequantized to fp32 on every step) and 4 (int8 compute); the engine mbuild builds for its default int8
profile (gate included) is timed beside them. mbuild's int4 profile refuses this random model at its gate
(teacher-forced top-1 agreement under 0.9 on near-flat logits), so int4 appears requantized only. Each arm:
the runtime's own DecoderEngine, one intra-op thread, pinned to one core, a 64-token prompt, decode steps at
batch 1 and 8, rounds interleaved. The profiles' accuracy_level choice (profiles/cpu.yaml) rests on this.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from bench.builds import build_mbuild
from bench.harness import Series, interleave, machine, write
from bench.llm_models import make_llama_100m
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine

STEPS = 20
BATCHES = (1, 8)
QUANTIZED = {"int8 level 0": (8, None), "int8 level 4": (8, 4), "int4 level 0": (4, None), "int4 level 4": (4, 4)}


def _requantize(fp32: Path, out: Path, bits: int, level: int | None) -> Path:
    if not (out / "model.onnx").is_file():
        shutil.copytree(fp32, out, dirs_exist_ok=True)
        quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32 / "model.onnx")), bits=bits, block_size=32,
                                         is_symmetric=True, accuracy_level=level)
        quantizer.process()
        quantizer.model.save_model_to_file(str(out / "model.onnx"), use_external_data_format=False)
    return out


def _step_ms(engine: DecoderEngine, batch: int) -> float:
    engine.lengths[:] = 0
    logits = np.concatenate([engine.run(row, np.array([list(range(3, 67))])) for row in range(batch)])
    for _ in range(3):  # warm
        logits = engine.run(0, logits.argmax(-1).reshape(-1, 1))
    started = time.perf_counter()
    for _ in range(STEPS):
        logits = engine.run(0, logits.argmax(-1).reshape(-1, 1))
    return (time.perf_counter() - started) / STEPS * 1000


def main(repeats: int = 3, work: Path | None = None) -> Path:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    work = work or Path(tempfile.gettempdir()) / "mbuild-bench-llm-kernels"
    model = make_llama_100m(work / "llama-100m")
    fp32 = build_mbuild(model, work / "build-fp32")
    folders = {"fp32 (mbuild)": fp32,
               **{name: _requantize(fp32, work / name.replace(" ", "-"), *q) for name, q in QUANTIZED.items()},
               "int8 (mbuild default profile)": build_mbuild(model, work / "build-int8", precision="int8")}
    engines = {name: DecoderEngine(folder, load_engine_config(folder), threads=1, slots=max(BATCHES))
               for name, folder in folders.items()}
    cases: list[tuple[str, Callable[[], float]]] = [
        (f"{name} b{batch}", partial(_step_ms, engine, batch)) for name, engine in engines.items() for batch in BATCHES]
    results = interleave(cases, repeats)
    data = {"machine": machine(), "unit": "ms per decode step (lower is better)",
            "results": {k: v.values for k, v in results.items()}}
    return write("llm_kernels", data, _markdown(results, list(engines)))


def _markdown(results: dict[str, Series], names: list[str]) -> str:
    fp32 = {b: results[f"fp32 (mbuild) b{b}"].median for b in BATCHES}
    rows = "\n".join(f"| {name} | " + " | ".join(
        f"{results[f'{name} b{b}'].median:.1f} ({results[f'{name} b{b}'].spread()}) | "
        f"{fp32[b] / results[f'{name} b{b}'].median:.2f}x" for b in BATCHES) + " |" for name in names)
    return f"""# Decode-step time per precision and MatMulNBits accuracy level

{__doc__}
| engine | batch 1 ms/step (min-max) | speed vs fp32 | batch 8 ms/step (min-max) | speed vs fp32 |
| --- | ---: | ---: | ---: | ---: |
{rows}

Reproduce: `.venv/bin/python -m bench llm_kernels` ({machine()['cores']} cores here, one used; {machine()['date']}).
Measured on an AVX-512 VNNI CPU only: the AVX2 and AVX-512 classes' profiles take the same setting unmeasured.
This is not the peer comparison: llama.cpp's server side by side is issue work still open.
"""
