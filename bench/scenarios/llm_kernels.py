"""Which quantized kernels a CPU language-model profile should build with: decode-step time per precision.

One random ~100M Llama (bench/lib/llm_models.py), exported by mbuild at fp32; ONNX Runtime's quantizers then
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
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from bench.lib.harness import OUT, Series, interleave, machine, matmul_model, work_folder, write
from bench.lib.llm_models import make_llama_words, measured_shape
from bench.lib.mbuild import build_mbuild, source_hash
from builder.engine.compile_ort import optimize
from runtimes.bundle import load_engine_config
from runtimes.engines.decoder import DecoderEngine

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "decode-step time and logit error per quantizer"

STEPS = 20
ACCURACY_TOKENS, ACCURACY_ROWS = 96, 8
BATCHES = (1, 4, 16)
QUANTIZED = {"int8 MatMulNBits b32": (8, 32), "int8 MatMulNBits b128": (8, 128), "int8 dynamic": (8, 0),
             "int4 MatMulNBits b32": (4, 32), "int4 MatMulNBits b128": (4, 128)}
MATRIX = (2048, 8192)  # K x N: a Llama-3.2-1B MLP projection
ROWS = (1, 16, 64, 512)  # a decode step at 1 and 16 streams, a 64-token prompt, a 512-token prefill chunk
MATRIX_ARMS = {"fp32": (32, 0), "int8 dynamic": (8, 0), "int8 MatMulNBits b128": (8, 128),
               "int4 MatMulNBits b128": (4, 128)}


def _quantize(source: Path, quantized: Path, bits: int, block: int) -> None:
    """block 0: dynamic int8 (per-channel weights, per-step activations); else MatMulNBits at accuracy level 4."""
    if not block:
        quantize_dynamic(source, quantized, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        return
    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=bits, block_size=block, is_symmetric=True,
                                     accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(quantized), use_external_data_format=False)


def _requantize(fp32: Path, out: Path, bits: int, block: int) -> Path:
    """block 0: dynamic int8 (per-channel weights, per-step activations); then optimized, as a build does."""
    stamp = out / "bench-source.txt"
    if out.is_dir() and not (stamp.is_file() and stamp.read_text() == source_hash()):
        shutil.rmtree(out)
    if not (out / "model.onnx").is_file():
        shutil.copytree(fp32, out, dirs_exist_ok=True)  # copies: the engine cache's hard links stay behind
        source, quantized = out / "fp32.onnx", out / "quantized.onnx"
        (out / "model.onnx").rename(source)  # its weights stay in model.onnx.data, which it names
        _quantize(source, quantized, bits, block)
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
    sequences = np.random.default_rng(1).integers(3, engine.config.decoder.vocab_size, (ACCURACY_ROWS, ACCURACY_TOKENS))
    return np.array([engine.run(row, sequences[row:row + 1, t:t + 1])[0]
                     for row in range(ACCURACY_ROWS) for t in range(ACCURACY_TOKENS)])


def _accuracy(engine: DecoderEngine, reference: np.ndarray) -> dict[str, float]:
    logits = _logits(engine)
    return {"top1": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
            "mean_logit_error": float(np.abs(logits - reference).mean())}


def _matrix_sessions(folder: Path) -> dict[str, ort.InferenceSession]:
    """One MATRIX-sized MatMul of random weights, in fp32 and through the same quantizers as the model arms."""
    folder.mkdir(parents=True, exist_ok=True)
    weight = np.random.default_rng(0).standard_normal(MATRIX, dtype=np.float32) * 0.02
    source = folder / "fp32.onnx"
    onnx.save(matmul_model(weight, "rows"), source)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {}
    for name, (bits, block) in MATRIX_ARMS.items():
        path = source if bits == 32 else folder / f"{name.replace(' ', '-')}.onnx"
        if bits != 32:
            _quantize(source, path, bits, block)
        sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return sessions


def _matrix_ms(session: ort.InferenceSession, rows: int) -> float:
    x = np.random.default_rng(rows).standard_normal((rows, MATRIX[0]), dtype=np.float32)
    session.run(None, {"x": x})  # warm
    calls, started = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - started < 0.3:
        session.run(None, {"x": x})
        calls += 1
    return (time.perf_counter() - started) / calls * 1000


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: the tiny Llama instead of the ~100M one (the one-matrix arms keep their size: seconds)."""
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    work = work or work_folder("llm-kernels", quick)
    key, shape = measured_shape(quick)
    model = make_llama_words(work / f"llama-{key}", shape)
    fp32 = build_mbuild(model, work / "build-fp32")
    default = build_mbuild(model, work / "build-default", precision=None)
    folders = {"fp32 (mbuild)": fp32,
               **{name: _requantize(fp32, work / name.replace(" ", "-"), *q) for name, q in QUANTIZED.items()},
               f"mbuild default build ({load_engine_config(default).precision})": default}
    engines = {name: DecoderEngine(folder, load_engine_config(folder), threads=1, slots=max(BATCHES))
               for name, folder in folders.items()}
    cases: list[tuple[str, Callable[[], float]]] = [
        (f"{name} b{batch}", partial(_step_ms, engine, batch)) for name, engine in engines.items() for batch in BATCHES]
    results = interleave(cases, repeats)
    reference = _logits(engines["fp32 (mbuild)"])
    accuracy = {name: _accuracy(engine, reference) for name, engine in engines.items()}
    names = list(engines)
    engines.clear()  # their sessions' memory, before the matrix arms
    matrix = interleave([(f"{name} rows{rows}", partial(_matrix_ms, session, rows))
                         for name, session in _matrix_sessions(work / "matrix").items() for rows in ROWS], repeats)
    data = {"machine": machine(), "unit": "ms per decode step (lower is better)",
            "results": {k: v.values for k, v in results.items()}, "accuracy": accuracy,
            "matrix_ms": {k: v.values for k, v in matrix.items()}}
    return write("llm_kernels", data, _markdown(results, names, accuracy, _matrix_markdown(matrix)), out,
                 measures=MEASURES)


def _matrix_markdown(matrix: dict[str, Series]) -> str:
    rows = "\n".join(f"| {name} | " + " | ".join(
        f"{matrix[f'{name} rows{r}'].median:.2f} ({matrix[f'{name} rows{r}'].median / r * 1000:.0f})" for r in ROWS)
        + " |" for name in MATRIX_ARMS)
    return f"""
## One weight matrix against the rows it multiplies

One {MATRIX[0]} x {MATRIX[1]} weight (a Llama-3.2-1B MLP projection), random, through the same quantizers, one
thread: ms per product (microseconds per row) at {", ".join(map(str, ROWS))} rows, which are a decode step at
one and at 16 streams, a 64-token prompt and a 512-token prefill chunk. A kernel that reuses each weight across
rows gets cheaper per row as rows grow; one that does not costs the same per row. The quantized weights (17 MB
at int8, 9 MB at int4) stay in this CPU's 32 MB L3 cache between calls, so their one-row column is faster than
inside a model, whose weights stream from memory every step.

| weights | {" | ".join(f"{r} row{'s' if r > 1 else ''}" for r in ROWS)} |
| --- |{" ---: |" * len(ROWS)}
{rows}
"""


def _markdown(results: dict[str, Series], names: list[str], accuracy: dict[str, dict[str, float]],
              matrix: str) -> str:
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
{matrix}
Reproduce: `.venv/bin/python -m bench llm_kernels` ({machine()['cores']} cores here, one used; {machine()['date']}).
Measured on an AVX-512 VNNI CPU only: the AVX2 and AVX-512 classes' profiles take the same setting unmeasured.
The served comparison with llama.cpp is `python -m bench llm_peer` (docs/benchmarks/llm_peer.md).
"""
