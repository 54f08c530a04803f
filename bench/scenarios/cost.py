"""What a replica costs and what it holds under an SLO: `mbuild bench` (AIPerf) on the CPU defaults, as a user runs it.

Two builds, each with the default profile and precision `mbuild package --gpu cpu` picks:
  embedder        all-MiniLM-L6-v2 (the real weights), `--workload embed` (256-token passages)
  language model  a random ~100M Llama on a word-level tokenizer (bench/lib/llm_models.py), 512 tokens in and
                  128 out (ignore_eos), streamed; it has no chat template, so /v1/completions. Its default build
                  is int8, the CPU profiles' first choice, where the gate passes, else fp32: on random weights
                  int8's teacher-forced top-1 sits at the gate's 0.9 line (its section's heading says which way
                  this run went). So the int8 engine is benched too (`--precision int8`, served past its gate if
                  need be), as the default a model whose int8 passes gets
Each is benched with `mbuild bench BUILD --cores 1`: the server on one core (the last), AIPerf on the other;
concurrency 1, 4 and 16, 4 requests a stream (16 at least) after one warm-up request a stream. Cost is the CPU
profile's list price (profiles/prices.yaml: one vCPU-hour of AWS c7i.large) times the replica's one core, over
the point's tokens an hour. The SLO points: embedder p90 request latency <= 100 ms, language model p90 TTFT <= 1 s
and p90 TPOT <= 100 ms. Energy: RAPL where the host exposes it, else the reason (bench.json's `energy`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_100M, LLAMA_TINY, make_llama_words
from bench.lib.mbuild import MBUILD, build_mbuild, build_or_engine, minilm_home
from builder.benchmark.report import rows
from builder.benchmark.result import BenchResult, parse_slo, read_result, slo_point
from builder.benchmark.sweep import list_price

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "what a replica serves and costs at an SLO, via mbuild bench"

ARMS = {  # name: (workload options, SLO)
    "embedder": (["--workload", "embed"], "latency=100ms"),
    "language model": (["--isl", "512", "--osl", "128"], "ttft=1s,tpot=100ms"),
    "language model, int8": (["--isl", "512", "--osl", "128"], "ttft=1s,tpot=100ms"),
}
QUICK_ARMS = {"embedder": (["--workload", "embed", "--isl", "32"], "latency=1s"),
              "language model": (["--isl", "32", "--osl", "8"], "ttft=10s"),
              "language model, int8": (["--isl", "32", "--osl", "8"], "ttft=10s")}


def _builds(work: Path, quick: bool) -> tuple[dict[str, Path], str | None]:
    minilm = build_mbuild("all-minilm-l6-v2", work / "minilm-default", minilm_home(work), precision=None).parent
    shape = LLAMA_TINY if quick else LLAMA_100M
    llama = make_llama_words(work / ("llama-100m-words" if not quick else "llama-quick-words"), shape)
    llm = build_mbuild(llama, work / ("llm-default" if not quick else "llm-quick"), precision=None).parent
    int8, gate = build_or_engine(llama, work, "int8")
    if isinstance(int8, str):
        raise RuntimeError(f"the int8 engine did not build: {int8}")
    print(f"int8 engine: gate {gate or 'passed'}")
    return {"embedder": minilm, "language model": llm, "language model, int8": int8}, gate


def _bench(build: Path, out: Path, options: list[str], slo: str, quick: bool) -> BenchResult:
    shutil.rmtree(out, ignore_errors=True)
    sweep = ["--concurrency", "1,2" if quick else "1,4,16", *(["--requests", "4"] if quick else [])]
    command = [*MBUILD, "bench", str(build), "--cores", "1", "-o", str(out), *options, *sweep, "--slo", slo]
    print("$ mbuild " + " ".join(command[len(MBUILD):]))
    done = subprocess.run(command, text=True, capture_output=True, check=False)
    print(done.stdout + done.stderr[-2000:])
    if done.returncode not in (0, 17):  # 17: no point met the SLO, which the report says
        raise RuntimeError(f"mbuild bench failed ({done.returncode}): {done.stderr[-2000:]}")
    return read_result(out)


def _section(name: str, result: BenchResult, slo: str, command: str) -> tuple[dict[str, Any], str]:
    objective = parse_slo(slo)
    chosen = slo_point(result, objective)
    table = rows(result, objective)
    m = result.measured
    lengths = f"{m.isl} tokens in" + (f", {m.osl} out" if m.osl else "")
    lines = [f"## {name}: {m.model}, profile {m.profile}", "",
             f"{m.workload} (POST /v1/{m.endpoint}): {lengths}; {m.unit} counted; {m.tool}; "
             f"price {result.price.source if result.price else 'none'}", "",
             f"    {command}", "",
             "| concurrency | req/s | tokens/s | per user | TTFT p90 ms | TPOT p90 ms | latency p90 ms | errors | "
             "$/M tokens | J/token |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in table:
        mark = " (SLO point)" if row["slo_point"] == "yes" else ""
        lines.append(f"| {row['concurrency']}{mark} | {row['requests_per_s']} | {row['tokens_per_s']} | "
                     f"{row['tokens_per_s_per_user']} | {row['ttft_p90_ms']} | {row['tpot_p90_ms']} | "
                     f"{row['latency_p90_ms']} | {row['errors']} | {row['usd_per_million_tokens']} | "
                     f"{row['joules_per_token']} |")
    cost = result.cost_per_million(chosen) if chosen else None
    priced = f", ${cost:.4f} per million {m.unit}" if cost is not None else ""
    verdict = (f"SLO ({objective.describe()}): concurrency {chosen.concurrency}, {chosen.tokens_per_s:.1f} {m.unit}/s "
               f"a replica{priced}" if chosen else f"SLO ({objective.describe()}): no point meets it")
    lines += ["", verdict, "", f"Energy: {result.energy}.", ""]
    data = {"result": json.loads(result.to_json()), "slo": slo, "slo_point": chosen.concurrency if chosen else None,
            "usd_per_million_at_slo": cost}
    return data, "\n".join(lines)


def main(repeats: int = 1, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """`python -m bench cost`: one sweep an arm (the sweep's points are its repeats)."""
    work = work or work_folder("cost", quick)
    builds, gate = _builds(work, quick)
    # the int8 engine of a failed gate has no build metadata, so no profile to price by: the same list price, given
    price = list_price("onnxruntime-cpu", 1)
    assert price is not None
    data: dict[str, Any] = {"machine": machine(), "arms": {}}
    parts = [f"# Cost and SLO points of the CPU defaults (`mbuild bench`)\n\n{(__doc__ or '').strip()}\n",
             f"Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores, {data['machine']['date']}.\n",
             "Reproduce: `python -m bench cost` (writes this page), or the `mbuild bench` lines below on a build.\n"]
    for name, (options, slo) in (QUICK_ARMS if quick else ARMS).items():
        given = ["--price-per-hour", f"{price.per_hour:g}"] if name.endswith("int8") else []
        result = _bench(builds[name], work / f"bench-{name.replace(' ', '-').replace(',', '')}", [*options, *given],
                        slo, quick)
        command = f"mbuild bench BUILD --cores 1 {' '.join([*options, *given])} --concurrency 1,4,16 --slo {slo}"
        data["arms"][name], text = _section(name, result, slo, command)
        if name.endswith("int8"):
            text = text.replace("profile \n", f"its int8 engine, served past its gate ({gate})\n", 1)
        parts.append(text)
    parts.append(LOAD_GENERATOR)
    path = write("cost", data, "\n".join(parts), out, measures=MEASURES)
    print(path.read_text())
    return path


LOAD_GENERATOR = """## Why AIPerf

Both load generators the issue names were installed here into fresh venvs from PyPI (2026-12-03, by hand):
aiperf 0.13.0 took 58 s and 1.2 GB, without torch, and ran offline against `mbuild serve` with the build's own
tokenizer.json for chat, completions and embeddings; guidellm 0.8.1 took 84 s and 6.0 GB, most of it a CUDA build of
torch (nvidia-cublas, nvidia-cudnn-cu13, ...) that a CPU host cannot use. mbuild keeps AIPerf
(`pip install 'mbuild[bench]'`) and reads its own summary, profile_export_aiperf.json; the integration test
(tests/integration/test_bench.py) checks every reported number against AIPerf's separate CSV summary.
"""
