"""What structured output costs: the same requests with and without a JSON schema, mbuild and llama.cpp.

One server, one model, beside llama.cpp's llama-server doing the same with its own grammar engine (json_schema
turned into a GBNF grammar).

  mbuild     `mbuild serve` of the CPU default profile (int8) of the random ~100M Llama of `bench llm_peer`
             (real Llama SPM tokenizer, 32000 tokens), MBUILD_THREADS=1; the schema goes as OpenAI's
             response_format json_schema, applied by llguidance as a token mask per sequence
  llama.cpp  llama-server on the q8_0 GGUF of the same weights, one thread, --parallel 16, `json_schema`
Every request streams POST /v1/completions with a 64-token prompt and decodes exactly 64 tokens (greedy; the
schema's list needs more than 64 tokens, so no constrained answer ends early). Both servers on one pinned core,
measured one at a time, the client on the other; the arms alternate within each round, after one warm-up run
of each (mbuild compiles a schema once and keeps it, as vLLM does, so the rounds measure what an application
that sends the same schema gets). The number that matters is TPOT with the schema over TPOT without, per
server and concurrency: the mask's cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.lib import llamacpp
from bench.lib.harness import OUT, interleave, machine, work_folder, write
from bench.lib.llm_client import run
from bench.lib.llm_models import make_llama_spm, measured_shape
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.mbuild import build_or_engine, context_of
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "what a JSON schema costs, beside llama.cpp's grammar"

NEW_TOKENS = 64
CONCURRENCY = (1, 16)
SEQUENTIAL = 4  # requests at concurrency 1
SCHEMA: dict[str, Any] = {  # an order of parts: nested objects, bounded strings, integer ranges, enums
    "type": "object", "additionalProperties": False, "required": ["customer", "items"],
    "properties": {
        "customer": {"type": "string", "maxLength": 32},
        "items": {"type": "array", "minItems": 40, "items": {
            "type": "object", "additionalProperties": False, "required": ["sku", "qty", "unit"],
            "properties": {"sku": {"type": "string", "maxLength": 12},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 999},
                           "unit": {"enum": ["piece", "box", "pallet"]}}}}}}


def body(prompt: str, server: str, model: str, schema: bool, bias: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "ignore_eos": True,
                           "temperature": 0.0, "logit_bias": bias, "stream": True,
                           "stream_options": {"include_usage": True}}
    if server == "mbuild":
        out["model"] = model
        if schema:
            out["response_format"] = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
    else:
        out["cache_prompt"] = False
        if schema:
            out["json_schema"] = SCHEMA
    return out


def check_constrained(url: str, payload: dict[str, Any]) -> str:
    """The schema arm must really be constrained: its answer opens as the schema's object does."""
    whole = {**payload, "stream": False}
    whole.pop("stream_options")
    text = str(httpx.post(url, json=whole, timeout=120).json()["choices"][0]["text"])
    if not "".join(text.split()).startswith('{"customer":"'):
        raise RuntimeError(f"{url}: the schema did not constrain the answer: {text[:80]!r}")
    return text


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: the tiny Llama, mbuild alone where llama.cpp is not built."""
    work = work or work_folder("peer")  # shares llm_peer's model and builds
    llamacpp.ensure_source()  # the Llama SPM vocabulary the model is made with
    peer = llamacpp.peer(quick)
    key, shape = measured_shape(quick)
    model = make_llama_spm(work / f"llama-{key}-spm", shape, llamacpp.SPM_VOCAB)
    build, ungated = build_or_engine(model, work, "int8")
    if isinstance(build, str):
        raise RuntimeError(f"mbuild int8 did not build: {build}")
    texts = Texts(model)
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*CONCURRENCY, SEQUENTIAL))]
    client_cpus, server_cpus = split_cores()
    ports = {"mbuild": free_port(), **({"llama.cpp": free_port()} if peer else {})}
    runs: dict[str, list[dict[str, float]]] = {}
    samples: dict[str, str] = {}
    with ExitStack() as stack:
        command = mbuild_serve(build, ports["mbuild"]) + (["--allow-failed-gate"] if ungated else [])
        stack.enter_context(server(command, READY, ports["mbuild"], {"MBUILD_THREADS": "1"},
                                   cpus={min(server_cpus)}))
        if peer:
            gguf = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf")["q8_0"]
            stack.enter_context(server(llamacpp.serve(gguf, ports["llama.cpp"], context_of({"int8": build}, model)),
                                       "/health", ports["llama.cpp"], cpus={min(server_cpus)}))
        stack.enter_context(pinned(client_cpus))
        served = served_name(ports["mbuild"])
        cases: list[tuple[str, Callable[[], float]]] = []
        for concurrency in CONCURRENCY:
            chosen = prompts[:SEQUENTIAL if concurrency == 1 else concurrency]
            for name, port in ports.items():
                url = f"http://{HOST}:{port}/v1/completions"
                for schema in (False, True):
                    arm = f"{name} {'schema' if schema else 'free'} c={concurrency}"
                    payloads = [body(p, name, served, schema, texts.silent()) for p in chosen]
                    if schema and concurrency == 1:
                        samples[name] = check_constrained(url, payloads[0])
                    runs[arm] = []
                    cases.append((arm, partial(run, url, payloads, concurrency, len, runs[arm])))
        for name, warm in cases:  # first-call costs (grammar compilation caches, sessions) stay out of the rounds
            warm()
            runs[name].clear()
        interleave(cases, repeats)
    data, markdown = report(runs, samples, repeats, ungated, list(ports))
    path = write("structured", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path


def _median(runs: list[dict[str, float]], key: str) -> float:
    values = sorted(r[key] for r in runs)
    return values[len(values) // 2]


def report(runs: dict[str, list[dict[str, float]]], samples: dict[str, str], repeats: int,
           ungated: str | None, servers: list[str]) -> tuple[dict[str, Any], str]:
    rows, ratios = [], {}
    for arm, measured in runs.items():
        rows.append(f"| {arm} | {_median(measured, 'total_tok_s'):.1f} | {_median(measured, 'tpot_p50_ms'):.1f} | "
                    f"{_median(measured, 'tpot_p99_ms'):.1f} | {_median(measured, 'ttft_p50_ms'):.0f} |")
    for name in servers:
        for c in CONCURRENCY:
            free, schema = runs[f"{name} free c={c}"], runs[f"{name} schema c={c}"]
            ratios[f"{name} c={c}"] = _median(schema, "tpot_p50_ms") / _median(free, "tpot_p50_ms")
    lines = [
        "# Structured output: the cost of a JSON schema", "",
        (__doc__ or "").strip(), "",
        "Reproduce: `python -m bench structured` (builds llama.cpp and the model into caches when missing).", "",
        f"{repeats} rounds, medians. Machine: {json.dumps(machine())}.", "",
        "| arm | output tok/s | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms |", "| --- | ---: | ---: | ---: | ---: |",
        *rows, "",
        "TPOT with the schema over TPOT without (1.00: free; the mask's cost is the excess):", "",
        "| server | c=1 | c=16 |", "| --- | ---: | ---: |",
        *[f"| {n} | {ratios[f'{n} c=1']:.2f} | {ratios[f'{n} c=16']:.2f} |" for n in servers], "",
        "What each server wrote under the schema (greedy, first 64 tokens):", "",
        *[f"- {n}: `{text[:120]}`" for n, text in samples.items()], "",
    ]
    if ungated:
        lines += [f"The random weights fail the int8 gate ({ungated}); the engine is served with "
                  "`mbuild serve --allow-failed-gate`, as in llm_peer.", ""]
    data = {"scenario": "structured", "repeats": repeats, "machine": machine(), "schema": SCHEMA, "runs": runs,
            "tpot_ratio": ratios, "samples": samples, "ungated": ungated}
    return data, "\n".join(lines)
