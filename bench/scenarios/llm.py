"""Language-model serving engines, side by side: output tokens/s at concurrency 1 and 16.

Arms, all fp32 on the same random ~100M Llama with the same intra-op thread count, in one process:
  mbuild      the runtime's continuous-batching scheduler over the exported ONNX engine
  transformers  `model.generate` in PyTorch, one request at a time (what a naive server does)
  ort-genai   onnxruntime-genai's own generator loop, one request at a time
Every request decodes exactly NEW_TOKENS tokens (min_tokens = max_tokens), greedy. At concurrency 16,
16 requests with prompts of 16-128 tokens are all submitted at once; the one-at-a-time arms work
through them in turn, which is how those servers behave.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from bench.lib.harness import OUT, interleave, machine, skipped, work_folder, write
from bench.lib.llm_models import build_genai, make_llama_words, measured_shape, workload
from bench.lib.mbuild import build_mbuild
from runtimes.bundle import load_engine_config
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.requests import Request
from runtimes.generation.sampling_request import exactly
from runtimes.metrics import Metrics
from runtimes.settings import Settings

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "generation engines in-process: mbuild, transformers, ort-genai"

NEW_TOKENS = 64
QUICK_NEW_TOKENS = 16  # a quick run's: the one-at-a-time arms' c=16 wave is 16 requests in turn
CONCURRENCY = (1, 16)


class Transformers:
    def __init__(self, model: Path, threads: int, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(model).eval()

    def one(self, prompt: list[int]) -> int:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.new_tokens,
                                      min_new_tokens=self.new_tokens, do_sample=False, pad_token_id=0)
        return int(out.shape[1] - len(prompt))

    def run(self, prompts: list[list[int]]) -> int:
        return sum(self.one(p) for p in prompts)


class Genai:
    def __init__(self, folder: Path, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        import onnxruntime_genai as og  # the peer's package: a quick run without it leaves its arm out

        self.og = og
        self.model = og.Model(str(folder))

    def one(self, prompt: list[int]) -> int:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + self.new_tokens, min_length=len(prompt) + self.new_tokens,
                                  do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.array(prompt, dtype=np.int32))
        made = 0
        while not generator.is_done():
            generator.generate_next_token()
            made += 1
        return made

    def run(self, prompts: list[list[int]]) -> int:
        return sum(self.one(p) for p in prompts)


class Mbuild:
    def __init__(self, engine_dir: Path, threads: int, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        config = load_engine_config(engine_dir)
        settings = dataclasses.replace(Settings.from_env({}), model_dir=engine_dir, threads=threads, max_queue=1024)
        self.runtime = GenerationRuntime.load(engine_dir, config, settings, Metrics())
        self.runtime.engine_loop.start()

    async def _one(self, prompt: list[int]) -> int:
        params = exactly(self.new_tokens)
        request = Request(prompt, params, asyncio.get_running_loop(), asyncio.Queue())
        self.runtime.engine_loop.submit([request])
        made = 0
        while True:
            event = await request.events.get()
            made += event.token is not None
            if event.finish:
                return made

    def run(self, prompts: list[list[int]], concurrent: bool) -> int:
        async def go() -> int:
            if concurrent:
                return sum(await asyncio.gather(*(self._one(p) for p in prompts)))
            return sum([await self._one(p) for p in prompts])

        return asyncio.run(go())


def _rate(run: Any, prompts: list[list[int]]) -> float:
    started = time.perf_counter()
    tokens = run(prompts)
    return tokens / (time.perf_counter() - started)


def _genai(model: Path, work: Path, threads: int, quick: bool, new_tokens: int) -> Genai | None:
    if quick and importlib.util.find_spec("onnxruntime_genai") is None:
        skipped("the ort-genai arm", "onnxruntime-genai is not installed (`pip install onnxruntime-genai`)")
        return None
    return Genai(build_genai(model, work / "genai", threads), new_tokens)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: the tiny Llama instead of the ~100M one, QUICK_NEW_TOKENS a request."""
    threads = min(2, os.cpu_count() or 1)
    new_tokens = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    work = work or work_folder("llm", quick)
    print(f"LLM benchmark: models in {work}, {threads} threads per arm, {repeats} interleaved rounds")
    key, shape = measured_shape(quick)
    model = make_llama_words(work / f"llama-{key}", shape)
    engine_dir = build_mbuild(model, work / "mbuild-build")
    mbuild = Mbuild(engine_dir, threads, new_tokens)
    one_at_a_time: dict[str, Transformers | Genai] = {"transformers": Transformers(model, threads, new_tokens)}
    if genai := _genai(model, work, threads, quick, new_tokens):
        one_at_a_time["ort-genai"] = genai
    cases: list[tuple[str, Callable[[], float]]] = []
    for concurrency in CONCURRENCY:
        prompts = workload(4 if concurrency == 1 else 16)
        together = concurrency > 1
        cases.append((f"mbuild c={concurrency}",
                      partial(_rate, partial(mbuild.run, concurrent=together), prompts)))
        for name, arm in one_at_a_time.items():
            cases.append((f"{name} c={concurrency}", partial(_rate, arm.run, prompts)))
    results = interleave(cases, repeats)
    data: dict[str, Any] = {"scenario": "L0 engines", "unit": "output tokens/s", "new_tokens": new_tokens,
                            "threads": threads, "machine": machine(), "results": {}}
    rows = []
    for concurrency in CONCURRENCY:
        ours = results[f"mbuild c={concurrency}"].median
        for name in ("mbuild", *one_at_a_time):
            series = results[f"{name} c={concurrency}"]
            data["results"][f"{name} c={concurrency}"] = {"values": series.values, "median": series.median}
            ratio = ours / series.median
            rows.append(f"| {concurrency} | {name} | {series.median:.1f} | {series.spread()} | "
                        f"{'-' if name == 'mbuild' else f'{ratio:.2f}x'} |")
            if name != "mbuild":
                data["results"][f"{name} c={concurrency}"]["mbuild_ratio"] = ratio
    markdown = "\n".join([
        "# Language-model engines: output tokens/s",
        "",
        __doc__.strip(),
        "",
        f"Machine: {data['machine']['cores']} cores ({data['machine']['cpu']}), {threads} intra-op threads per "
        f"arm, {repeats} interleaved rounds, median and min-max of the rounds; {new_tokens} new tokens per request.",
        "",
        "| concurrency | arm | tokens/s (median) | min-max | mbuild / arm |",
        "| ---: | --- | ---: | ---: | ---: |",
        *rows,
        "",
        "Targets (issue 4/7): at concurrency 16, mbuild >= 3x transformers and >= 1.5x ort-genai.",
        "",
        "Reproduce: `python -m bench llm` (writes docs/benchmarks/llm.json and llm.md).",
        "",
    ])
    path = write("llm", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
