"""The numerical gate for language models: the compiled engine against transformers.generate.

The engine under test is the runtime's own: prompts go through the serving scheduler together, so
they decode batched with continuous batching exactly as in the image. fp32 must decode
token for token what transformers' greedy generate decodes (>= 32 tokens per prompt); quantized
profiles whose tolerance says greedy_exact: false (int8 and int4, with int8 compute) are judged on
teacher-forced top-1 agreement and logit error instead, since quantized weights and activations move
near-tied logits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from builder.engine.quiet import quiet_ml
from builder.errors import ValidationFailed
from builder.planning.profiles import Tolerance
from runtimes.bundle import load_engine_config
from runtimes.generation.requests import Request
from runtimes.generation.runtime import GenerationRuntime
from runtimes.generation.sampling import SamplingParams
from runtimes.metrics import Metrics
from runtimes.settings import Settings

NEW_TOKENS = 32
PROMPTS = (
    "The quick brown fox",
    "Containers package software with",
    "def add(a, b):",
    "Hello, world! How are you",
)


def _reference(model_dir: Path, prompts: list[list[int]]) -> tuple[list[list[int]], list[np.ndarray]]:
    with quiet_ml():
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        tokens, logits = [], []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            # An explicit mask: generate would otherwise mask every token equal to the pad id (often BOS).
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=model.generation_config.pad_token_id
                                 if model.generation_config.pad_token_id is not None else 0)
            tokens.append(out.sequences[0, len(prompt):].tolist())
            logits.append(torch.stack(out.logits)[:, 0].numpy())
    return tokens, logits


async def _served(runtime: GenerationRuntime, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy decode through the serving scheduler, all prompts at once; returns tokens and max batch."""
    loop = asyncio.get_running_loop()
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS)
    requests = [Request(p, params, loop, asyncio.Queue()) for p in prompts]
    for request in requests:
        runtime.scheduler.submit([request])
    runtime.scheduler.start()
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
    runtime.scheduler.stop()
    return outputs, len(prompts)


def _teacher_forced(runtime: GenerationRuntime, prompts: list[list[int]], reference: list[list[int]],
                    ref_logits: list[np.ndarray]) -> dict[str, float]:
    """Feed the reference tokens and compare every step's logits with the reference's."""
    engine = runtime.engine
    engine.lengths[:] = 0
    rows = range(len(prompts))
    logits = np.concatenate([engine.run(row, np.array([prompts[row]], np.int64)) for row in rows])
    agree, total, worst, errors = 0, 0, 0.0, []
    for step in range(NEW_TOKENS):
        for row in rows:
            want = ref_logits[row][step]
            agree += int(np.argmax(logits[row]) == np.argmax(want))
            total += 1
            diff = np.abs(logits[row] - want)
            worst = max(worst, float(diff.max()))
            errors.append(float(diff.mean()))
        logits = engine.run(0, np.array([[ref[step]] for ref in reference], np.int64))
    return {"top1_agreement": agree / total, "max_logit_error": worst, "mean_logit_error": float(np.mean(errors)),
            "positions": total}


def run_gate(model_dir: Path, engine_dir: Path, tolerance: Tolerance, report_path: Path) -> dict[str, Any]:
    config = load_engine_config(engine_dir)
    settings = dataclasses.replace(Settings.from_env({}), model_dir=engine_dir, max_batch=max(len(PROMPTS), 1))
    runtime = GenerationRuntime.load(engine_dir, config, settings, Metrics())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    reference, ref_logits = _reference(model_dir, prompts)
    served, batch = asyncio.run(_served(runtime, prompts))
    forced = _teacher_forced(runtime, prompts, reference, ref_logits)
    equal = [a == b for a, b in zip(served, reference, strict=True)]
    if tolerance.greedy_exact:
        passed = all(equal)
        summary = f"greedy decode equal to transformers on {sum(equal)}/{len(equal)} prompts x {NEW_TOKENS} tokens"
    else:
        passed = forced["top1_agreement"] >= tolerance.min_top1 and (
            tolerance.max_logit_error is None or forced["max_logit_error"] <= tolerance.max_logit_error)
        summary = (f"teacher-forced top-1 agreement {forced['top1_agreement']:.3f} (>= {tolerance.min_top1}), "
                   f"max logit error {forced['max_logit_error']:.3f}")
    report = {
        "task": "text-generation",
        "reference": "transformers generate (PyTorch, fp32, CPU, greedy)",
        "new_tokens": NEW_TOKENS,
        "batched": batch,
        "prompts": [{"text": text, "prompt_tokens": len(p), "engine": s, "reference": r, "equal": e}
                    for text, p, s, r, e in zip(PROMPTS, prompts, served, reference, equal, strict=True)],
        "greedy_equal": sum(equal),
        **forced,
        "tolerance": tolerance.model_dump(),
        "summary": summary,
        "passed": bool(passed),
    }
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if not passed:
        raise ValidationFailed(f"the compiled engine differs from transformers: {summary}",
                               hint=f"see {report_path}; try a higher precision profile (--precision fp32)")
    return report
