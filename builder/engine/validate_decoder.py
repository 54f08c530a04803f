"""The numerical gate for language models: the compiled engine against transformers in fp32.

The engine under test is the runtime's own: prompts go through the serving scheduler together, so
they decode batched with continuous batching exactly as in the image. Its greedy tokens are then fed
back through the engine and through the reference (reference.py: transformers' modules, one layer in
memory at a time, after the engine is closed, so the gate never holds both or the fp32 model whole),
and the logits compared position by position.
fp32 must pick, at every position, the token the reference picks (>= 32 tokens per prompt): then
transformers' greedy decode is the engine's, token for token. Quantized profiles whose tolerance says
greedy_exact: false (int8 and int4) are judged on top-1 agreement and logit error instead, since
quantized weights and activations move near-tied logits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from pathlib import Path

import numpy as np

from builder.errors import UnsupportedModel, ValidationFailed
from builder.planning.profiles import Tolerance
from runtimes.bundle import load_engine_config
from runtimes.bundle.codec import write_contract
from runtimes.bundle.report import DecoderReport, GateTolerance, PromptCheck
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.requests import Request
from runtimes.generation.sampling_request import exactly
from runtimes.metrics import Metrics
from runtimes.settings import Settings

NEW_TOKENS = 32
GATE_CONTEXT = 256  # the prompts' tokens and NEW_TOKENS fit in it
PROMPTS = (
    "The quick brown fox",
    "Containers package software with",
    "def add(a, b):",
    "Hello, world! How are you",
)


async def _served(runtime: GenerationRuntime, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy decode through the serving scheduler, all prompts at once; returns tokens and max batch."""
    loop = asyncio.get_running_loop()
    params = exactly(NEW_TOKENS)
    requests = [Request(p, params, loop, asyncio.Queue()) for p in prompts]
    for request in requests:
        runtime.engine_loop.submit([request])
    runtime.engine_loop.start()
    outputs: list[list[int]] = []
    for request in requests:
        tokens: list[int] = []
        while True:
            event = await request.events.get()
            if event.error:
                raise ValidationFailed(f"the engine failed during the gate: {event.error}")
            if event.token is not None:
                tokens.append(event.token)
            if event.finish is not None:
                break
        outputs.append(tokens)
    runtime.engine_loop.stop()
    return outputs, len(prompts)


def _forced_logits(runtime: GenerationRuntime, prompts: list[list[int]], served: list[list[int]]) -> list[np.ndarray]:
    """The engine's logits along its own greedy tokens, all rows stepping together: [NEW_TOKENS, vocab] each."""
    engine = runtime.engine
    engine.lengths[:] = 0
    rows = range(len(prompts))
    steps = [np.concatenate([engine.run(row, np.array([prompts[row]], np.int64)) for row in rows])]
    for step in range(NEW_TOKENS - 1):
        steps.append(engine.run(0, np.array([[tokens[step]] for tokens in served], np.int64)).copy())
    return [np.stack([logits[row] for logits in steps]) for row in rows]


def _without(logits: np.ndarray, tokens: list[int]) -> np.ndarray:
    if not tokens:
        return logits
    masked = logits.copy()
    masked[:, tokens] = -np.inf
    return masked


def _compare(engine: list[np.ndarray], reference: list[np.ndarray]) -> dict[str, float]:
    pairs = list(zip(engine, reference, strict=True))
    agree = sum(int((np.argmax(e, axis=1) == np.argmax(r, axis=1)).sum()) for e, r in pairs)
    total = sum(len(e) for e in engine)
    diffs = [np.abs(e - r) for e, r in pairs]
    return {"top1_agreement": agree / total, "max_logit_error": float(max(d.max() for d in diffs)),
            "mean_logit_error": float(np.mean([d.mean(axis=1) for d in diffs])), "positions": total}


def _gate_prompts(runtime: GenerationRuntime) -> list[list[int]]:
    """PROMPTS through the tokenizer the image serves with; a tokenizer that fails on plain text, or drops all of it
    (characters outside its vocabulary, and no unknown token its model holds), is the model's fault, said so."""
    hint = ("check the model's tokenizer.json: its vocabulary should cover plain text, and the unknown token its "
            "model names must be one of the model's own tokens")
    prompts = []
    for text in PROMPTS:
        try:
            ids = runtime.encode(text)
        except Exception as exc:  # tokenizers raises a bare Exception (e.g. "Unk token `<unk>` not found")
            raise UnsupportedModel(f"the model's tokenizer cannot encode the text {text!r}: {exc}", hint=hint) from exc
        if not ids:
            raise UnsupportedModel(f"the model's tokenizer turns the text {text!r} into no tokens at all, so the "
                                   "engine has nothing to be checked on", hint=hint)
        prompts.append(ids)
    return prompts


def run_gate(model_dir: Path, engine_dir: Path, tolerance: Tolerance, report_path: Path) -> DecoderReport:
    # The gate's sequences are short: a small context keeps the KV cache's reservation small (its pages are
    # committed as positions are written, but an 8B model's slot reserves 1 GB of address space at 4096 tokens).
    config = dataclasses.replace(load_engine_config(engine_dir), max_seq_length=GATE_CONTEXT)
    settings = dataclasses.replace(Settings.from_env({}), model_dir=engine_dir, max_batch=max(len(PROMPTS), 1))
    started = time.perf_counter()  # the load as the image does it: deploy sizes its startup probe from this
    runtime = GenerationRuntime.load(engine_dir, config, settings, Metrics())
    load_seconds = time.perf_counter() - started
    prompts = _gate_prompts(runtime)
    served, batch = asyncio.run(_served(runtime, prompts))
    engine_logits = _forced_logits(runtime, prompts, served)
    del runtime
    gc.collect()  # the engine's memory goes back before the reference's layers come
    # Imported only now: PyTorch and transformers (~0.5 GB) never sit beside the engine.
    from builder.engine.quiet import quiet_ml
    from builder.engine.reference import reference_logits

    with quiet_ml():
        ref_logits = reference_logits(model_dir, [p + s for p, s in zip(prompts, served, strict=True)],
                                      [len(p) for p in prompts])
    forced = _compare(engine_logits, ref_logits)
    # What the reference picks after each of the engine's tokens: where all equal the engine's, transformers'
    # greedy decode is the engine's; the first difference is where the two decodes part.
    # The served decode forbids the end tokens (min_tokens, so every prompt gives NEW_TOKENS): the reference
    # picks among the same tokens, or a model whose argmax is an end token would fail a gate it passes.
    ends = list(config.decoder.eos_token_ids)
    reference = [np.argmax(_without(r, ends), axis=1).tolist() for r in ref_logits]
    equal = [a == b for a, b in zip(served, reference, strict=True)]
    if tolerance.greedy_exact:
        passed = all(equal)
        summary = f"greedy decode equal to transformers on {sum(equal)}/{len(equal)} prompts x {NEW_TOKENS} tokens"
    else:
        passed = forced["top1_agreement"] >= tolerance.min_top1 and (
            tolerance.max_logit_error is None or forced["max_logit_error"] <= tolerance.max_logit_error)
        summary = (f"teacher-forced top-1 agreement {forced['top1_agreement']:.3f} (>= {tolerance.min_top1}), "
                   f"max logit error {forced['max_logit_error']:.3f}")
    if config.source_format:  # no unquantized original exists: the reference runs the checkpoint's own values
        summary += f" (reference: the {config.source_format} checkpoint, dequantized)"
    report = DecoderReport(
        reference="transformers modules (PyTorch, fp32, CPU, a layer at a time) along the engine's greedy tokens"
                  + (f", on the {config.source_format} checkpoint's weights dequantized (decoded to fp32)"
                     if config.source_format else ""),
        new_tokens=NEW_TOKENS,
        batched=batch,
        prompts=tuple(PromptCheck(text, len(p), tuple(s), tuple(r), e)
                      for text, p, s, r, e in zip(PROMPTS, prompts, served, reference, equal, strict=True)),
        greedy_equal=sum(equal),
        top1_agreement=float(forced["top1_agreement"]), max_logit_error=float(forced["max_logit_error"]),
        mean_logit_error=float(forced["mean_logit_error"]), positions=int(forced["positions"]),
        tolerance=GateTolerance(**tolerance.model_dump()),
        load_seconds=round(load_seconds, 3),
        summary=summary,
        passed=bool(passed),
    )
    write_contract(report_path, report)
    if not passed:
        raise ValidationFailed(f"the compiled engine differs from transformers: {summary}",
                               hint=f"see {report_path}; try a higher precision profile (--precision fp32)")
    return report
