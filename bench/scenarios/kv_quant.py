"""An 8-bit (and 4-bit) KV cache in ONNX Runtime's CPU GroupQueryAttention, against the fp32 cache mbuild keeps now.

One GroupQueryAttention node (ONNX Runtime's contrib op, the one mbuild's decoder graph runs), one decode step:
each of B sequences adds one token to a cache holding C tokens, the cache laid out as mbuild's (batch, KV heads,
slot length, head dim), one thread on one pinned core. Arms: the fp32 cache; int8 with per-channel scales and with
one per-tensor scale (`k_quant_type`/`v_quant_type`, `kv_cache_bit_width` 8, int8 past/present); 4-bit
(`kv_cache_bit_width` 4, two values a byte) where the kernel takes it. The cache holds seeded normal values,
quantized symmetrically with scales from its own range (as a build would calibrate them); the error column is the
attention output's largest difference from the fp32 cache's. Shapes: the ~100M Llama of llm_peer (10 heads, 5 KV
heads of 64) and Llama-3.1-8B's attention (32 heads, 8 KV heads of 128). Median of 30 calls after 3 warm-ups.
Then whole decode steps: the runtime's DecoderEngine on mbuild's int8 builds of llm_context's two random Llamas
(its models and builds: ~100M at batch 1 and 16, Llama-3.2-1B-shaped at 1 and 8), its fp32 cache against the same
engine with an int8 cache (builder/engine/kv_cache_quant.py), B sequences at C cached positions (written first)
decoding one token each, one thread, a step of each engine in turn (20 a repeat, --repeats).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from bench.lib import decode_steps, llamacpp
from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY, make_llama_spm
from bench.lib.mbuild import build_or_engine
from bench.lib.servers import pinned, split_cores

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "an 8-bit and a 4-bit KV cache: attention calls and decode steps"

SHAPES = {"100m": (10, 5, 64), "8b": (32, 8, 128)}  # heads, KV heads, head dim
CASES = ((1, 2048), (16, 2048), (16, 8192))  # (sequences, cached tokens)
QUICK_CASES = ((2, 256),)
ARMS = {"fp32": (TensorProto.FLOAT, None, 32), "int8 per-channel": (TensorProto.INT8, "PER_CHANNEL", 8),
        "int8 per-tensor": (TensorProto.INT8, "PER_TENSOR", 8),
        "int4 per-channel": (TensorProto.UINT8, "PER_CHANNEL", 4)}
CALLS = 30
STEP_CONTEXTS = (128, 512, 1024, 2047)
# llm_context's shapes and models (its work folder's builds), the 1B at llm_context's batches
STEP_SHAPES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {"100m": (LLAMA_100M, (1, 16)),
                                                                   "1b": (LLAMA_1B, (1, 8))}
STEP_TITLES = {"100m": "~100M Llama", "1b": "Llama-3.2-1B-shaped Llama", "tiny": "tiny Llama"}
PAIRED_STEPS = 20  # each engine's steps a repeat


def _model(shape: tuple[int, int, int], batch: int, length: int, arm: str) -> bytes:
    heads, kv, dim = shape
    cache, quant, bits = ARMS[arm]
    attrs: dict[str, Any] = {"num_heads": heads, "kv_num_heads": kv}
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length", "", "", "", "", ""]
    stored = dim if bits != 4 else dim // 2
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 1, w * dim])
              for n, w in (("q", heads), ("k", kv), ("v", kv))]
    inputs += [helper.make_tensor_value_info(n, cache, [batch, kv, length, stored]) for n in ("past_key", "past_value")]
    inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [batch]),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1])]
    if quant:
        attrs.update(k_quant_type=quant, v_quant_type=quant, kv_cache_bit_width=bits)
        names += ["k_scale", "v_scale"]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, _scale_shape(quant, kv, dim))
                   for n in ("k_scale", "v_scale")]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in
               (("out", TensorProto.FLOAT), ("present_key", cache), ("present_value", cache))]
    graph = helper.make_graph([node], "attention", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())


def _scale_shape(quant: str, kv: int, dim: int) -> list[int]:
    return [1] if quant == "PER_TENSOR" else [kv, 1, dim]


def _quantized(values: np.ndarray, quant: str, bits: int) -> tuple[np.ndarray, np.ndarray]:
    top = 2 ** (bits - 1) - 1
    if quant == "PER_TENSOR":
        scale = np.array([np.abs(values).max() / top], np.float32)
    else:  # one scale per KV head and channel
        scale = (np.abs(values).max(axis=(0, 2)) / top).astype(np.float32)[:, None, :]
    steps = np.clip(np.round(values / scale), -top, top).astype(np.int8)
    if bits == 8:
        return steps, scale
    # 4-bit: offset by 8, two a byte, the even channel in the low nibble (the layout whose output matched best:
    # two's complement nibbles or the high nibble first were 7x to 50x further from the fp32 cache's output)
    nibbles = (steps.astype(np.int16) + 8).astype(np.uint8)
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8), scale


def _case(shape: tuple[int, int, int], batch: int, length: int, options: ort.SessionOptions) -> dict[str, Any]:
    heads, kv, dim = shape
    rng = np.random.default_rng(0)
    widths = (("q", heads), ("k", kv), ("v", kv))
    new = {n: rng.standard_normal((batch, 1, w * dim), dtype=np.float32) for n, w in widths}
    past = {n: rng.standard_normal((batch, kv, length, dim), dtype=np.float32) for n in ("past_key", "past_value")}
    base = {**new, "seqlens_k": np.full((batch,), length - 1, np.int32),
            "total_sequence_length": np.array([length], np.int32)}
    found: dict[str, Any] = {}
    reference = None
    for arm, (_, quant, bits) in ARMS.items():
        feed = dict(base)
        if quant is None:
            feed.update(past)
        else:
            for n, scale_name in (("past_key", "k_scale"), ("past_value", "v_scale")):
                feed[n], feed[scale_name] = _quantized(past[n], quant, bits)
        try:
            session = ort.InferenceSession(_model(shape, batch, length, arm), options,
                                           providers=["CPUExecutionProvider"])
            out = session.run(["out"], feed)[0]
        except Exception as exc:  # the kernel refusing an arm is a result: say which and why
            found[arm] = {"refused": str(exc).splitlines()[0][:300]}
            continue
        for _ in range(3):
            session.run(["out"], feed)
        times = []
        for _ in range(CALLS):
            start = time.perf_counter()
            session.run(["out"], feed)
            times.append(time.perf_counter() - start)
        reference = out if reference is None else reference
        found[arm] = {"ms": float(np.median(times) * 1000), "max_abs_error": float(np.abs(out - reference).max()),
                      "cache_bytes": int(sum(feed[n].nbytes for n in ("past_key", "past_value")))}
    return found


def _markdown(results: dict[str, Any], doc: str, quick: bool) -> str:
    lines = [f"# 8-bit KV cache in ONNX Runtime's CPU GroupQueryAttention{' (quick)' if quick else ''}", "",
             doc.strip(), "", "Reproduce: `python -m bench kv_quant`.", "",
             f"Machine: {results['machine']['cpu']}, {results['machine']['date']}.", "",
             "| shape | sequences x cached tokens | arm | ms a step | speed vs fp32 | cache MB | max abs error |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for key, cases in results["shapes"].items():
        for case, arms in cases.items():
            fp32 = arms.get("fp32", {}).get("ms")
            for arm, row in arms.items():
                if "refused" in row:
                    lines.append(f"| {key} | {case} | {arm} | refused: {row['refused']} | | | |")
                    continue
                ratio = f"{fp32 / row['ms']:.2f}x" if fp32 else "-"
                lines.append(f"| {key} | {case} | {arm} | {row['ms']:.2f} | {ratio} | "
                             f"{row['cache_bytes'] / 1e6:.1f} | {row['max_abs_error']:.4f} |")
    return "\n".join(lines) + "\n"


def _steps(work: Path, quick: bool, repeats: int) -> dict[str, Any]:
    """Per shape, whole decode steps, fp32 cache against int8 cache, per (batch, context): steps of the two taken in
    turn (decode_steps.paired_ms), PAIRED_STEPS a repeat."""
    found: dict[str, Any] = {}
    shapes: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {"tiny": (LLAMA_TINY, (1, 2))} if quick else STEP_SHAPES
    for key, (shape, batches) in shapes.items():
        model = make_llama_spm(work / f"llama-{key}-spm", shape, llamacpp.SPM_VOCAB)
        built, _ = build_or_engine(model, work, "int8", planned_cache=False)
        if isinstance(built, str):
            found[key] = {"error": f"the int8 engine did not build: {built[:300]}"}
            continue
        contexts = (64,) if quick else STEP_CONTEXTS
        fp32 = decode_steps.fp32_cache_engine(built / "model", work / f"{built.name}-fp32-cache", max(batches))
        int8 = decode_steps.int8_cache_engine(built / "model", work / f"{built.name}-int8-cache", max(batches))
        cells: dict[str, float] = {}
        for b in batches:
            for c in contexts:
                a, q, ratio = decode_steps.paired_ms(fp32, int8, b, c, PAIRED_STEPS * repeats)
                cells |= {f"fp32 cache b{b} ctx{c}": a, f"int8 cache b{b} ctx{c}": q, f"ratio b{b} ctx{c}": ratio}
                print(f"  {key} b{b} ctx{c}: fp32 cache {a:.2f} ms, int8 cache {q:.2f} ms, paired {ratio:.3f}",
                      flush=True)
        found[key] = {"build": str(built), "batches": list(batches), "contexts": list(contexts),
                      "steps": PAIRED_STEPS * repeats, "ms": cells}
        del fp32, int8
    return found


def _steps_markdown(shapes: dict[str, Any]) -> list[str]:
    lines = []
    for key, steps in shapes.items():
        if "error" in steps:
            lines += ["", f"Whole decode steps, {key}: {steps['error']}"]
            continue
        lines += ["", f"## Whole decode steps, the int8 build of the {STEP_TITLES.get(key, key)}", "",
                  f"{steps['steps']} steps of each engine, one of each in turn, every slot's positions written "
                  "first; the ratio is the median of the pairs' ratios.", "",
                  "| batch | context | fp32 cache ms | int8 cache ms | int8 / fp32 |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for b in steps["batches"]:
            for c in steps["contexts"]:
                fp32, int8 = steps["ms"][f"fp32 cache b{b} ctx{c}"], steps["ms"][f"int8 cache b{b} ctx{c}"]
                lines.append(f"| {b} | {c} | {fp32:.2f} | {int8:.2f} | {steps['ms'][f'ratio b{b} ctx{c}']:.2f}x |")
    return lines


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench kv_quant`: the attention sweep (each cell a median of CALLS calls), then the whole steps'
    rounds."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    results: dict[str, Any] = {"machine": machine(), "onnxruntime": ort.__version__, "shapes": {}}
    work = work or work_folder("kv_quant", quick)
    llamacpp.ensure_source()  # the Llama SPM vocabulary the model is made with
    with pinned({min(split_cores()[1])}):
        for key, shape in (list(SHAPES.items())[:1] if quick else SHAPES.items()):
            results["shapes"][key] = {f"{b} x {c}": _case(shape, b, c, options)
                                      for b, c in (QUICK_CASES if quick else CASES)}
        # the whole steps share llm_context's (and llm_peer's) models and builds
        results["steps"] = _steps(work if quick else work_folder("peer"), quick, 1 if quick else repeats)
    markdown = _markdown(results, __doc__ or "", quick) + "\n".join(_steps_markdown(results["steps"])) + "\n"
    path = write("kv_quant", results, markdown, out, measures=MEASURES)
    print(markdown)
    return path
