"""Checkpoints published quantized, built and served: GPTQ and FP8 against the same model in bf16.

One random Llama-3.2-1B-shaped model (the real Llama SPM tokenizer, read offline from llama.cpp's vocab GGUF), stored
bf16 as published, and two copies of it written as their formats lay them out (tests/support/
quantized_checkpoints.py): GPTQ int4 in groups of 128 (symmetric, no act-order: the layout of the Hub's common
GPTQ Llamas) and FP8 E4M3 with 128x128 block scales (DeepSeek's and Qwen3-FP8's).
Builds, each `mbuild package --backend none --gpu cpu` with an empty engine cache, wall time and the peak RSS of
its process tree sampled every 0.1 s (bench/lib/rss.py):
  bf16 -> int4, GPTQ -> int4 (its codes kept as MatMulNBits blocks), bf16 -> int8, FP8 -> int8 (the default)
Serving, one pinned core for the servers (one measured at a time, the arms alternating), the client on another:
  mbuild int4 of the GPTQ checkpoint, mbuild int4 of the bf16 one (`mbuild serve`, MBUILD_THREADS=1), and
  llama.cpp q4_0 of the GPTQ checkpoint (its convert_hf_to_gguf.py dequantizes GPTQ; llama-quantize to q4_0;
  `llama-server --threads 1`): the same weights.
Every request streams POST /v1/completions with a 64-token text prompt and decodes exactly 64 tokens; c=1 sends
requests one after another, c=16 one wave, after a warm-up wave.
"""

from __future__ import annotations

import functools
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from bench.lib import llamacpp
from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_1B, LLAMA_TINY, make_llama_spm
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import rounds
from bench.lib.llm_peer_report import METRICS, arm_series
from bench.lib.llm_peer_shapes import Shape
from bench.lib.llm_peer_shapes import quick as smoke
from bench.lib.mbuild import build_or_engine, build_record, build_row
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY
from tests.support import quantized_checkpoints as qc

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "GPTQ and FP8 checkpoints built and served, against bf16 and llama.cpp"

SOURCES: dict[str, tuple[Any, dict[str, object]]] = {
    "GPTQ": (functools.partial(qc.gptq, bits=4, group=128, act_order=False, v2=False),
             {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}),
    "FP8": (functools.partial(qc.fp8_blocks, block=128),
            {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})}
BUILDS = (("bf16", "int4"), ("GPTQ", "int4"), ("bf16", "int8"), ("FP8", "int8"))  # (source, precision)
SERVED = ("GPTQ int4", "bf16 int4")  # mbuild's arms; llama.cpp q4_0 of the GPTQ checkpoint beside them
PEER = "llama.cpp q4_0"
SHAPE = Shape("1b", "random Llama-3.2-1B-shaped, bf16", LLAMA_1B, concurrency=(1, 16), sequential=2)
QUICK = smoke(Shape("1b", "random tiny Llama (quick)", LLAMA_TINY))


def models(shape: Shape, work: Path) -> dict[str, Path]:
    bf16 = make_llama_spm(work / "llama-bf16", shape.config, llamacpp.SPM_VOCAB, dtype=torch.bfloat16)
    found = {"bf16": bf16}
    for name, (quantize, config) in SOURCES.items():
        folder = work / f"llama-{name.lower()}"
        found[name] = folder if folder.is_dir() else qc.write(bf16, folder, config, quantize, twin=False)
    return found


def measure(shape: Shape, work: Path, repeats: int, results: dict[str, Any]) -> None:
    sources = models(shape, work)
    builds: dict[str, Path | str] = {}
    for source, precision in BUILDS:
        arm = f"{source} {precision}"
        print(f"{shape.title}: building mbuild {arm}", flush=True)
        with tempfile.TemporaryDirectory(dir=work) as engines:  # no cached engine: every build exports and gates
            builds[arm], gate = build_or_engine(sources[source], work, precision, {"MBUILD_ENGINE_CACHE": engines})
        if gate is not None:
            results["ungated"][arm] = gate
    results["builds"] = {arm: str(b) if isinstance(b, Path) else f"did not build: {b}" for arm, b in builds.items()}
    results["build_memory"] = {arm: build_record(b) for arm, b in builds.items() if isinstance(b, Path)}
    gguf = llamacpp.ggufs(llamacpp.spm_ready(sources["GPTQ"]), work / "gguf-gptq", kinds=("q4_0",))["q4_0"] \
        if llamacpp.peer(False) else None
    client, servers = split_cores()
    texts = Texts(sources["bf16"])
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    with ExitStack() as stack:
        urls: dict[str, str] = {}
        names: dict[str, str | None] = {}
        for arm in SERVED:
            build = builds[arm]
            if isinstance(build, Path):
                port = free_port()
                command = mbuild_serve(build, port) + (["--allow-failed-gate"] if arm in results["ungated"] else [])
                stack.enter_context(server(command, READY, port, {"MBUILD_THREADS": "1"},
                                           cpus={min(servers)}))
                urls[arm], names[arm] = f"http://{HOST}:{port}/v1/completions", served_name(port)
        if gguf is not None:
            port = free_port()
            context = 2048
            stack.enter_context(server(llamacpp.serve(gguf, port, context), "/health", port, None,
                                       cpus={min(servers)}))
            urls[PEER], names[PEER] = f"http://{HOST}:{port}/v1/completions", None
        stack.enter_context(pinned(client))
        rounds(shape, urls, names, prompts, texts, repeats, results["runs"])


def _served(results: dict[str, Any], shape: Shape, data: dict[str, Any]) -> list[str]:
    rows = ["| c | arm | total tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | / llama.cpp q4_0 |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for concurrency in shape.concurrency:
        series = {arm: arm_series(results, f"{shape.key} {arm} c={concurrency}") for arm in (*SERVED, PEER)}
        peer = series[PEER]
        for arm, found in series.items():
            if found is None:
                rows.append(f"| {concurrency} | {arm} | not measured | - | - | - | - | - |")
                continue
            data["results"][f"{arm} c={concurrency}"] = {m: {"median": s.median, "values": s.values}
                                                          for m, s in found.items()}
            ratio = found["total_tok_s"].median / peer["total_tok_s"].median if peer and arm != PEER else None
            tok = found["total_tok_s"]
            rows.append(f"| {concurrency} | {arm} | {tok.median:.1f} ({tok.spread()}) | "
                        + " | ".join(f"{found[m].median:.0f}" if "ttft" in m else f"{found[m].median:.1f}"
                                     for m in METRICS[1:]) + f" | {f'{ratio:.2f}x' if ratio else '-'} |")
    return rows


def _builds(results: dict[str, Any]) -> list[str]:
    rows = ["| source -> precision | peak RSS GiB | stage at the peak | wall s | gate |",
            "| --- | ---: | --- | ---: | --- |"]
    for source, precision in BUILDS:
        arm = f"{source} {precision}"
        rows.append(build_row(f"{source} -> {precision}", results["build_memory"].get(arm), results["builds"][arm],
                              results["ungated"].get(arm, "passed")))
    return rows


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench prequantized`. Quick: a tiny model, smoke-sized runs."""
    work = work or work_folder("prequantized", quick)
    work.mkdir(parents=True, exist_ok=True)
    shape = QUICK if quick else SHAPE
    print(f"pre-quantized checkpoints: work in {work}, {repeats} rounds{' (quick)' if quick else ''}")
    llamacpp.ensure_source()  # the vocabulary GGUF the model's tokenizer comes from
    results: dict[str, Any] = {key: {} for key in ("runs", "builds", "ungated", "build_memory")}
    measure(shape, work, repeats, results)
    command = f"python -m bench prequantized {'--quick' if quick else f'--repeats {repeats}'}"
    data: dict[str, Any] = {"machine": machine(), "repeats": repeats, "quick": quick, "results": {},
                            "builds": results["build_memory"], "gates": results["ungated"]}
    lines = [f"# Pre-quantized checkpoints{' (quick smoke run)' if quick else ''}", "", (__doc__ or "").strip(),
             "", f"## {shape.title}", "", "Builds:", "", *_builds(results), "", "Served:", "",
             *_served(results, shape, data), "",
             f"Reproduce: `{command}` (writes docs/benchmarks/prequantized.json and .md; `--quick` runs a tiny model "
             "into a scratch folder instead).", ""]
    markdown = "\n".join(lines)
    path = write("prequantized", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
