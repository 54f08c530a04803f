"""Which quantized kernels a CPU language-model profile should build with: decode-step time per precision.

One random ~100M Llama (bench/llm_models.py), exported by mbuild at fp32; ONNX Runtime's quantizers then
write the candidates: int8 as MatMulNBits blocks of 32 and of 128 with int8 compute (accuracy_level 4,
what mbuild's int8 profiles build on VNNI CPUs, in blocks of 128), int8 as dynamic quantization
(per-channel int8 weights, activations quantized per step: what the other CPU classes' int8 profiles
build), int4 as MatMulNBits at accuracy_level 4 in blocks of 32 and of 128; the engine `mbuild package`
builds by default (the first precision that passes its gate on this random model) is timed beside them.
Level 0 (the quantizer's default, weights dequantized to fp32 every step) was measured before at 325 ms
(int8) and 9.4 ms (int4) per step at batch 1 against 8.3 and 6.2 at level 4, and is left out. Each arm:
the runtime's own DecoderEngine, one intra-op thread, pinned to one core, a 64-token prompt, decode steps
at batch 1, 4 and 16, rounds interleaved. The profiles' quantizer choice (profiles/cpu.yaml) and the
default precision order (builder/planning/selection.py) rest on this.
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
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from bench.builds import build_mbuild, source_hash
from bench.harness import Series, interleave, machine, write
from bench.llm_models import make_llama_100m
from builder.engine.compile_ort import optimize
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine

STEPS = 20
ACCURACY_TOKENS, ACCURACY_ROWS = 96, 8
BATCHES = (1, 4, 16)
QUANTIZED = {"int8 MatMulNBits b32": (8, 32), "int8 MatMulNBits b128": (8, 128), "int8 dynamic": (8, 0),
             "int4 MatMulNBits b32": (4, 32), "int4 MatMulNBits b128": (4, 128)}


def _requantize(fp32: Path, out: Path, bits: int, block: int) -> Path:
    """block 0: dynamic int8 (per-channel weights, per-step activations); then optimized, as a build does."""
    stamp = out / "bench-source.txt"
    if out.is_dir() and not (stamp.is_file() and stamp.read_text() == source_hash()):
        shutil.rmtree(out)
    if not (out / "model.onnx").is_file():
        shutil.copytree(fp32, out, dirs_exist_ok=True)  # copies: the engine cache's hard links stay behind
        source, quantized = out / "fp32.onnx", out / "quantized.onnx"
        (out / "model.onnx").rename(source)  # its weights stay in model.onnx.data, which it names
        if not block:
            quantize_dynamic(source, quantized, weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"],
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        else:
            quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=bits, block_size=block,
                                             is_symmetric=True, accuracy_level=4)
            quantizer.process()
            quantizer.model.save_model_to_file(str(quantized), use_external_data_format=False)
        source.unlink()
        (out / "model.onnx.data").unlink(missing_ok=True)
        optimize(quantized, out / "model.onnx")
        quantized.unlink()
        stamp.write_text(source_hash())
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


def _logits(engine: DecoderEngine) -> np.ndarray:
    """Logits at every position of fixed random sequences, one token a step: what accuracy compares."""
    engine.lengths[:] = 0
    sequences = np.random.default_rng(1).integers(3, engine.config.dimensions, (ACCURACY_ROWS, ACCURACY_TOKENS))
    return np.array([engine.run(row, sequences[row:row + 1, t:t + 1])[0]
                     for row in range(ACCURACY_ROWS) for t in range(ACCURACY_TOKENS)])


def _accuracy(engine: DecoderEngine, reference: np.ndarray) -> dict[str, float]:
    logits = _logits(engine)
    return {"top1": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
            "mean_logit_error": float(np.abs(logits - reference).mean())}


def main(repeats: int = 3, work: Path | None = None) -> Path:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    work = work or Path(tempfile.gettempdir()) / "mbuild-bench-llm-kernels"
    model = make_llama_100m(work / "llama-100m")
    fp32 = build_mbuild(model, work / "build-fp32")
    default = build_mbuild(model, work / "build-default", precision=None)
    folders = {"fp32 (mbuild)": fp32,
               **{name: _requantize(fp32, work / name.replace(" ", "-"), *q) for name, q in QUANTIZED.items()},
               f"mbuild default build ({load_engine_config(default).options['precision']})": default}
    engines = {name: DecoderEngine(folder, load_engine_config(folder), threads=1, slots=max(BATCHES))
               for name, folder in folders.items()}
    cases: list[tuple[str, Callable[[], float]]] = [
        (f"{name} b{batch}", partial(_step_ms, engine, batch)) for name, engine in engines.items() for batch in BATCHES]
    results = interleave(cases, repeats)
    reference = _logits(engines["fp32 (mbuild)"])
    accuracy = {name: _accuracy(engine, reference) for name, engine in engines.items()}
    data = {"machine": machine(), "unit": "ms per decode step (lower is better)",
            "results": {k: v.values for k, v in results.items()}, "accuracy": accuracy}
    return write("llm_kernels", data, _markdown(results, list(engines), accuracy))


def _markdown(results: dict[str, Series], names: list[str], accuracy: dict[str, dict[str, float]]) -> str:
    fp32 = {b: results[f"fp32 (mbuild) b{b}"].median for b in BATCHES}
    rows = "\n".join(f"| {name} | " + " | ".join(
        f"{results[f'{name} b{b}'].median:.1f} ({results[f'{name} b{b}'].spread()}) | "
        f"{fp32[b] / results[f'{name} b{b}'].median:.2f}x" for b in BATCHES)
        + f" | {accuracy[name]['top1']:.3f} | {accuracy[name]['mean_logit_error']:.4f} |" for name in names)
    header = " | ".join(f"batch {b} ms/step (min-max) | speed vs fp32" for b in BATCHES)
    return f"""# Decode-step time per precision and MatMulNBits accuracy level

{__doc__}
| engine | {header} | top-1 agreement with fp32 | mean logit error |
| --- |{" ---: | ---: |" * len(BATCHES)} ---: | ---: |
{rows}

Accuracy: each engine's logits against the fp32 engine's at {ACCURACY_ROWS * ACCURACY_TOKENS} positions
({ACCURACY_TOKENS} random tokens in each of {ACCURACY_ROWS} rows, one token a step). A random model's logits are
near-tied (their spread is ~0.5), so top-1 agreement moves with small errors; the build's gate, on 128
positions, passes at 0.9.

Reproduce: `.venv/bin/python -m bench llm_kernels` ({machine()['cores']} cores here, one used; {machine()['date']}).
Measured on an AVX-512 VNNI CPU only: the AVX2 and AVX-512 classes' profiles take the same setting unmeasured.
The served comparison with llama.cpp is `python -m bench llm_peer` (docs/benchmarks/llm_peer.md).
"""
