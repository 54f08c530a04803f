"""The generic export beside the fast lane: the same weights built both ways, int8 (the default), served.

mbuild exports a language model of a family it writes by hand through that graph (the fast lane,
builder/engine/decoder_graph.py) and any other through transformers' own modeling code (the generic path,
builder/engine/generic/); `--model-impl generic` takes the generic path for a fast-lane family, which is what makes
the two comparable on the same checkpoint. Arms, per model:
  fast lane  `mbuild package --backend none --gpu cpu --precision int8` (--model-impl auto: the fast lane)
  generic    the same with `--model-impl generic`
each served by `mbuild serve`, MBUILD_THREADS=1, both on one pinned core (one measured at a time, the arms
alternating), the client on another.
Models: random checkpoints, stored bf16 as published:
  dense  Llama-3.2-1B's shape (16 layers, hidden 2048, MLP 8192, 32 query heads and 8 KV heads of 64) with the real
         Llama SPM tokenizer (read offline from llama.cpp's vocab GGUF; 32000 rows)
  moe    a Qwen3-MoE of 8 layers (hidden 1024, 16 query heads and 4 KV heads of 64, 32 experts of 512, 4 a token)
         with Qwen's tokenizer (151936 rows)
Every request streams POST /v1/completions with a 64-token text prompt and decodes exactly 64 tokens; c=1 sends
requests one after another, c=16 one wave, after a warm-up wave. Builds: each `mbuild package`'s wall time and the
peak RSS of its process tree, sampled every 0.1 s (bench/lib/rss.py), with an empty engine cache.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib import llamacpp
from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_1B, LLAMA_TINY, make_llama_spm, make_qwen, qwen_tokenizer
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts
from bench.lib.llm_peer_pairs import rounds
from bench.lib.llm_peer_report import METRICS, arm_series
from bench.lib.llm_peer_shapes import Shape, quick
from bench.lib.mbuild import build_or_engine, build_record, build_row
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "the generic export against the fast lane, same weights, int8"

PRECISION = "int8"
ARMS = {"fast lane": "auto", "generic": "generic"}  # arm -> --model-impl
TARGET = 0.8  # issue 58: the generic path serves >= 0.8x the fast lane's tokens/s at c=1 and c=16
MOE = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16,
       "num_key_value_heads": 4, "head_dim": 64, "moe_intermediate_size": 512, "num_experts": 32,
       "num_experts_per_tok": 4, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "max_position_embeddings": 4096, "tie_word_embeddings": False}
TINY_MOE = {**LLAMA_TINY, "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "tie_word_embeddings": False}
SHAPES = {"dense": Shape("dense", "random Llama-3.2-1B-shaped", LLAMA_1B, concurrency=(1, 16), sequential=2),
          "moe": Shape("moe", "random Qwen3-MoE, 8 layers of 32 experts", MOE, concurrency=(1, 16))}
QUICK = {"dense": quick(Shape("dense", "random tiny Llama (quick)", LLAMA_TINY)),
         "moe": quick(Shape("moe", "random tiny Qwen3-MoE (quick)", TINY_MOE))}


def _model(shape: Shape, work: Path) -> Path:
    if shape.key == "dense":
        return make_llama_spm(work / f"llama-{shape.key}", shape.config, llamacpp.SPM_VOCAB)
    tokenizer = qwen_tokenizer(llamacpp.CACHE / "tokenizer-qwen2", llamacpp.QWEN2_VOCAB)
    return make_qwen(work / f"qwen3-moe-{shape.key}", "qwen3_moe", shape.config, tokenizer)


def measure(shape: Shape, work: Path, repeats: int, results: dict[str, Any]) -> None:
    """Both builds, then both servers on one core, their rounds interleaved."""
    model = _model(shape, work)
    builds: dict[str, Path | str] = {}
    with tempfile.TemporaryDirectory(dir=work) as engines:  # no cached engine: every build exports and gates
        for arm, impl in ARMS.items():
            print(f"{shape.title}: building mbuild {PRECISION}, {arm}", flush=True)
            builds[arm], gate = build_or_engine(model, work, PRECISION, {"MBUILD_ENGINE_CACHE": engines}, impl=impl)
            if gate is not None:
                results["ungated"].setdefault(shape.key, {})[arm] = gate
    results["builds"][shape.key] = {arm: str(b) if isinstance(b, Path) else f"did not build: {b}"
                                    for arm, b in builds.items()}
    results["build_memory"][shape.key] = {arm: build_record(b) for arm, b in builds.items() if isinstance(b, Path)}
    client, servers = split_cores()
    texts = Texts(model)
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    with ExitStack() as stack:
        urls: dict[str, str] = {}
        names: dict[str, str | None] = {}
        for arm, build in builds.items():
            if isinstance(build, Path):
                port = free_port()
                command = mbuild_serve(build, port) + (["--allow-failed-gate"] if arm in results["ungated"].get(
                    shape.key, {}) else [])
                stack.enter_context(server(command, READY, port, {"MBUILD_THREADS": "1"},
                                           cpus={min(servers)}))
                urls[arm], names[arm] = f"http://{HOST}:{port}/v1/completions", served_name(port)
        stack.enter_context(pinned(client))
        rounds(shape, urls, names, prompts, texts, repeats, results["runs"])


def _table(results: dict[str, Any], shape: Shape, data: dict[str, Any]) -> list[str]:
    rows = ["| c | export | total tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | "
            "generic / fast lane tokens/s |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for concurrency in shape.concurrency:
        series = {arm: arm_series(results, f"{shape.key} {arm} c={concurrency}") for arm in ARMS}
        fast, generic = series["fast lane"], series["generic"]
        ratio = generic["total_tok_s"].median / fast["total_tok_s"].median if fast and generic else None
        data["ratios"].setdefault(shape.key, {})[str(concurrency)] = ratio
        for arm, found in series.items():
            if found is None:
                rows.append(f"| {concurrency} | {arm} | did not build | - | - | - | - | - |")
                continue
            data["results"][f"{shape.key} {arm} c={concurrency}"] = {
                m: {"median": s.median, "values": s.values} for m, s in found.items()}
            shown = f"{ratio:.2f}x" if arm == "generic" and ratio is not None else "-"
            tok = found["total_tok_s"]
            rows.append(f"| {concurrency} | {arm} | {tok.median:.1f} ({tok.spread()}) | "
                        + " | ".join(f"{found[m].median:.0f}" if "ttft" in m else f"{found[m].median:.1f}"
                                     for m in METRICS[1:]) + f" | {shown} |")
    return rows


def _builds(results: dict[str, Any], shape: Shape) -> list[str]:
    rows = ["| export | peak RSS GiB | stage at the peak | wall s | gate |", "| --- | ---: | --- | ---: | --- |"]
    for arm in ARMS:
        rows.append(build_row(arm, results["build_memory"][shape.key].get(arm), results["builds"][shape.key][arm],
                              results["ungated"].get(shape.key, {}).get(arm, "passed")))
    return rows


def report(results: dict[str, Any], shapes: list[Shape], repeats: int, quick_run: bool,
           command: str) -> tuple[dict[str, Any], str]:
    data: dict[str, Any] = {"machine": machine(), "repeats": repeats, "quick": quick_run, "target": TARGET,
                            "results": {}, "ratios": {}, "builds": results["build_memory"]}
    lines = [f"# The generic export against the fast lane{' (quick smoke run)' if quick_run else ''}", "",
             (__doc__ or "").strip(), ""]
    for shape in shapes:
        ratios = data["ratios"]
        table = _table(results, shape, data)
        met = [f"c={c} {r:.2f}x{'' if r >= TARGET else ' (**behind**)'}" if r else f"c={c} not measured"
               for c, r in ratios.get(shape.key, {}).items()]
        lines += [f"## {shape.title}", "", f"generic / fast lane total tokens/s (target >= {TARGET}x): "
                  f"{'; '.join(met)}.", "", *table, "", "Builds:", "", *_builds(results, shape), ""]
    lines += [f"Reproduce: `{command}` (writes docs/benchmarks/llm_generic.json and .md; `--quick` runs tiny models "
              "into a scratch folder instead).", ""]
    return data, "\n".join(lines)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench llm_generic`. Quick: tiny models, smoke-sized runs."""
    work = work or work_folder("generic", quick)
    work.mkdir(parents=True, exist_ok=True)
    shapes = list((QUICK if quick else SHAPES).values())
    print(f"the generic export against the fast lane: work in {work}, {repeats} rounds{' (quick)' if quick else ''}")
    llamacpp.ensure_source()  # the vocabulary GGUFs the models' tokenizers come from
    results: dict[str, Any] = {key: {} for key in ("runs", "builds", "ungated", "build_memory")}
    for shape in shapes:
        measure(shape, work, repeats, results)
    command = f"python -m bench llm_generic {'--quick' if quick else f'--repeats {repeats}'}"
    data, markdown = report(results, shapes, repeats, quick, command)
    path = write("llm_generic", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
