"""E1 embeddings served, side by side; E2 the distance to this machine's floor.

Arms, all serving all-MiniLM-L6-v2 on loopback, one sentence a request, driven by the same closed-loop
client (bench/lib/loadgen.py) at concurrency 1, 4 and 16, in one run:
  mbuild fp32      `mbuild serve` of the fp32 profile (ONNX Runtime, dynamic batching)
  mbuild int8      `mbuild serve` of the int8 profile (per-channel dynamic quantization)
  naive torch      FastAPI + sentence-transformers on PyTorch, one `encode` per request (bench/peers/naive_embed_app.py)
  naive st-onnx    the same FastAPI app on sentence-transformers' own ONNX Runtime backend (backend="onnx"),
                   in its own venv: its exporter (optimum-onnx) pins transformers < 4.58 and huggingface-hub < 1
Every server is pinned to the same cores with the same thread count; the client runs on a core of its own.
Accuracy: min cosine of each arm's embeddings against sentence-transformers on PyTorch, over sentences
of 1 to ~200 words (cut at the model's 256 tokens, as sentence-transformers cuts), asked over HTTP.

E2: MiniLM's matmul FLOPs per sequence (at the benchmark sentence's token count) x sequences/s at
concurrency 16, divided by the peak fp32 matmul rate measured here with the same cores and threads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.encoder import QUICK_SECONDS, SECONDS, SENTENCE, Engine, flops_per_sequence
from bench.lib.harness import OUT, Series, fp32_peak_gflops, interleave, machine, skipped, work_folder, write
from bench.lib.loadgen import Load, closed_loop, post
from bench.lib.mbuild import MINILM, build_mbuild, minilm_home, minilm_path
from bench.lib.plots import save_embedding_plot
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, server, split_cores, uvicorn_app
from runtimes.health import READY
from runtimes.tokenize import TextTokenizer

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "MiniLM embeddings served, against sentence-transformers"

CONCURRENCY = (1, 4, 16)
QUICK_PEAK_SHAPES = ((512, 512, 512),)  # a quick run's matmul floor: one small shape, not the published ones
ACCURACY_TEXTS = ["hi", "The cat sat on the mat.", SENTENCE,
                  "Health checks tell a load balancer when a replica can take traffic. " * 4,
                  " ".join(f"word{i}" for i in range(200)), "Ünïcödé and emoji 🚀 in one line"]
ST_ONNX_PACKAGES = ["torch==2.13.0", "sentence-transformers", "optimum-onnx[onnxruntime]", "fastapi", "uvicorn"]


@dataclass
class Arm:
    name: str
    command: list[str]
    port: int
    ready: str
    env: dict[str, str]
    min_cosine: float = float("nan")


def st_onnx_python(work: Path) -> Path:
    """A venv for sentence-transformers' ONNX backend, made once (a minute or two) and kept in `work`."""
    venv = work / "st-onnx-venv"
    python = venv / "bin" / "python"
    if not (venv / "ready").is_file():
        print(f"  making {venv} for sentence-transformers' ONNX backend")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *ST_ONNX_PACKAGES], check=True)
        (venv / "ready").touch()
    return python


def arms(work: Path, threads: int, quick: bool) -> list[Arm]:
    home = minilm_home(work)
    found: list[Arm] = []
    for precision in ("fp32", "int8"):
        build = build_mbuild(MINILM, work / f"mbuild-{precision}", home, precision).parent
        port = free_port()
        found.append(Arm(f"mbuild {precision}", mbuild_serve(build, port), port, READY,
                         {**home, "MBUILD_THREADS": str(threads)}))
    for name, backend in (("naive torch", "torch"), ("naive st-onnx", "onnx")):
        if backend == "onnx" and quick and not (work / "st-onnx-venv" / "ready").is_file():
            skipped("the naive st-onnx arm", f"its venv {work / 'st-onnx-venv'} is missing; `python -m bench "
                    "embeddings` (no --quick) makes it once (a few minutes of pip)")
            continue
        python = st_onnx_python(work) if backend == "onnx" else Path(sys.executable)
        port = free_port()
        env = {"BENCH_MODEL_DIR": str(minilm_path()), "BENCH_BACKEND": backend, "BENCH_THREADS": str(threads)}
        found.append(Arm(name, uvicorn_app("bench.peers.naive_embed_app:app", port, python), port, "/health",
                         {**home, **env}))
    return found


def min_cosine(port: int, reference: np.ndarray) -> float:
    body = httpx.post(f"http://{HOST}:{port}/v1/embeddings", json={"input": ACCURACY_TEXTS, "truncate": "END"},
                      timeout=60).json()
    got = np.array([row["embedding"] for row in body["data"]], dtype=np.float64)
    cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    return float(cos.min())


def reference_embeddings() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path()), device="cpu")
    return np.asarray(model.encode(ACCURACY_TEXTS), dtype=np.float64)


def _measure(port: int, concurrency: int, client: set[int], loads: list[Load], seconds: float) -> float:
    with pinned(client):
        load = closed_loop(HOST, port, post(HOST, port, "/v1/embeddings", {"input": SENTENCE}), concurrency, seconds)
    if load.failures:
        raise RuntimeError(f"port {port}: non-200 answers {load.failures}")
    loads.append(load)
    return load.rate


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: one-second cases, a one-shape matmul floor, the st-onnx arm only where its venv is made."""
    work = work or work_folder("embeddings")
    seconds = QUICK_SECONDS if quick else SECONDS
    client, servers = split_cores()
    threads = len(servers)
    print(f"embeddings benchmark: builds in {work}; servers on cores {sorted(servers)} with {threads} thread(s), "
          f"client on {sorted(client)}; {repeats} interleaved rounds of {seconds:.0f}s per case")
    found = arms(work, threads, quick)
    reference = reference_embeddings()
    loads: dict[str, list[Load]] = {}
    cases: list[tuple[str, Callable[[], float]]] = []
    with ExitStack() as stack:
        for arm in found:
            port = stack.enter_context(server(arm.command, arm.ready, arm.port, arm.env, cpus=servers))
            arm.min_cosine = min_cosine(port, reference)
            closed_loop(HOST, port, post(HOST, port, "/v1/embeddings", {"input": SENTENCE}), 16, 1.0)  # warm
            for concurrency in CONCURRENCY:
                name = f"{arm.name} c={concurrency}"
                loads[name] = []
                cases.append((name, partial(_measure, port, concurrency, client, loads[name], seconds)))
        results = interleave(cases, repeats)
    engine_dir = work / "mbuild-fp32" / "model"
    tokenizer = TextTokenizer(engine_dir / "tokenizer.json", 512)
    tokens = len(tokenizer.encode([SENTENCE])[0])
    config = json.loads((minilm_path() / "config.json").read_text())
    flops = flops_per_sequence(config, tokens)
    with pinned(servers):  # the cores' peak; the fp32 engine alone, one sentence at a time (the floor under c=1 p50)
        peak = fp32_peak_gflops(threads, QUICK_PEAK_SHAPES, 2) if quick else fp32_peak_gflops(threads)
        engine_ms = Engine(engine_dir, threads).call_ms()
    data = _summary(found, results, loads, flops, tokens, peak, threads, repeats, seconds)
    data["fp32_engine_ms_per_sentence"] = engine_ms
    path = write("embeddings", data, render(data), out, measures=MEASURES)
    save_embedding_plot(data, out / "embeddings.png")
    print(path.read_text())
    return path


def _summary(found: list[Arm], results: dict[str, Series], loads: dict[str, list[Load]], flops: float,
             tokens: int, peak: float, threads: int, repeats: int, seconds: float) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for arm in found:
        for concurrency in CONCURRENCY:
            name = f"{arm.name} c={concurrency}"
            runs = loads[name]
            rows[name] = {"arm": arm.name, "concurrency": concurrency, "min_cosine": arm.min_cosine,
                          "rate": results[name].values, "rate_median": results[name].median,
                          "p50_ms": float(np.median([r.p50_ms for r in runs])),
                          "p99_ms": float(np.median([r.p99_ms for r in runs]))}
    naive16, naive1 = rows["naive torch c=16"], rows["naive torch c=1"]
    for row in rows.values():
        row["throughput_vs_naive"] = row["rate_median"] / rows[f"naive torch c={row['concurrency']}"]["rate_median"]
        row["p50_vs_naive"] = row["p50_ms"] / rows[f"naive torch c={row['concurrency']}"]["p50_ms"]
        row["gflops"] = flops * row["rate_median"] / 1e9
        row["share_of_peak"] = row["gflops"] / peak
    return {"scenario": "E1 embeddings, E2 distance to the floor", "machine": machine(), "threads": threads,
            "repeats": repeats, "seconds_per_run": seconds, "tokens_per_sequence": tokens,
            "flops_per_sequence": flops, "peak_fp32_gflops": peak, "rows": rows,
            "targets": {"fp32 c=16 >= 2x naive": rows["mbuild fp32 c=16"]["rate_median"] / naive16["rate_median"],
                        "int8 c=16 >= 3x naive": rows["mbuild int8 c=16"]["rate_median"] / naive16["rate_median"],
                        "fp32 p50 c=1 <= 0.5x naive": rows["mbuild fp32 c=1"]["p50_ms"] / naive1["p50_ms"]}}


def _verdict(value: float, bound: float, higher: bool) -> str:
    met = value >= bound if higher else value <= bound
    return "met" if met else f"missed by {abs(value - bound) / bound:.0%}"


def render(data: dict[str, Any]) -> str:
    rows = data["rows"]
    table = ["| arm | c | sequences/s (median, min-max) | p50 ms | p99 ms | vs naive | p50 vs naive | min cosine |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows.values():
        table.append(f"| {row['arm']} | {row['concurrency']} | {row['rate_median']:.1f} "
                     f"({min(row['rate']):.1f}-{max(row['rate']):.1f}) | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                     f"{row['throughput_vs_naive']:.2f}x | {row['p50_vs_naive']:.2f}x | {row['min_cosine']:.6f} |")
    floor = [f"| {row['arm']} | {row['rate_median']:.1f} | {row['gflops']:.1f} | {row['share_of_peak']:.1%} |"
             for name, row in rows.items() if name.endswith("c=16")]
    fp32, int8 = rows["mbuild fp32 c=16"], rows["mbuild int8 c=16"]
    targets = data["targets"]
    checks = [
        f"- fp32 throughput at c=16: **{targets['fp32 c=16 >= 2x naive']:.2f}x** the naive PyTorch server "
        f"(target >= 2x: {_verdict(targets['fp32 c=16 >= 2x naive'], 2, True)}), min cosine {fp32['min_cosine']:.6f} "
        f"(target >= 0.9999: {_verdict(fp32['min_cosine'], 0.9999, True)})",
        f"- int8 throughput at c=16: **{targets['int8 c=16 >= 3x naive']:.2f}x** (target >= 3x: "
        f"{_verdict(targets['int8 c=16 >= 3x naive'], 3, True)}), min cosine {int8['min_cosine']:.6f} "
        f"(target >= 0.98: {_verdict(int8['min_cosine'], 0.98, True)})",
        f"- fp32 p50 at c=1: **{targets['fp32 p50 c=1 <= 0.5x naive']:.2f}x** the naive server's (target <= 0.5x: "
        f"{_verdict(targets['fp32 p50 c=1 <= 0.5x naive'], 0.5, False)}). The fp32 engine alone takes "
        f"{data['fp32_engine_ms_per_sentence']:.2f} ms per sentence in-process on the same core "
        f"({data['fp32_engine_ms_per_sentence'] / rows['naive torch c=1']['p50_ms']:.2f}x the naive p50); "
        f"HTTP, JSON, the batcher's thread hop and the access log add the other "
        f"{rows['mbuild fp32 c=1']['p50_ms'] - data['fp32_engine_ms_per_sentence']:.2f} ms, client included, "
        "on the server's one core",
    ]
    m = data["machine"]
    return "\n".join([
        "# Embeddings: mbuild against what users would run instead", "", __doc__.strip(), "",
        f"Machine: {m['cores']} cores ({m['cpu']}), servers pinned with {data['threads']} thread(s) each, the client "
        f"on another core; {data['repeats']} interleaved rounds of {data['seconds_per_run']:.0f}s per case; "
        "sequences/s is the median of the rounds, p50/p99 the median of the rounds' percentiles.", "",
        "## Targets", "", *checks, "",
        "## E1: throughput, latency, accuracy", "", *table, "", "![throughput and p50 per arm](embeddings.png)", "",
        "## E2: distance to the floor", "",
        f"MiniLM: {data['flops_per_sequence'] / 1e6:.1f} MFLOPs per sequence of {data['tokens_per_sequence']} tokens "
        f"(matmuls only). Peak fp32 matmul here: {data['peak_fp32_gflops']:.1f} GFLOP/s on the servers' "
        f"{data['threads']} core(s) (the best of PyTorch's and ONNX Runtime's on square and 512-row "
        "Llama-3.2-1B MLP matmuls).", "",
        "| arm at c=16 | sequences/s | GFLOP/s achieved | share of the fp32 peak |", "| --- | ---: | ---: | ---: |",
        *floor, "",
        "int8 rows count the same FLOPs against the fp32 peak; VNNI's int8 peak is higher still.", "",
        "Reproduce: `python -m bench embeddings` (writes docs/benchmarks/embeddings.{json,md,png}).", ""])
