"""What the serving layer costs: the mbuild service against a bare app, and against its own engine.

Arms, all on loopback, driven by the same closed-loop client (bench/lib/loadgen.py), in one run:
  bare app       Starlette on uvicorn, POST /v1/embeddings answers a fixed JSON, no model (the floor)
  mbuild tiny    the mbuild service (BentoML, auth, limits, metrics, access log, dynamic batching) over a
                 near-no-op engine: a 2-layer, 32-wide random BERT; its in-process cost per call is listed
  mbuild MiniLM  the service over all-MiniLM-L6-v2 (fp32 ONNX Runtime), 16 clients, one sentence a request
  engine MiniLM  the same engine in-process: tokenize + run 16 sentences at a time, in batches of the
                 profile's max_batch as the service's batcher runs them, no HTTP
Both servers run their defaults (MBUILD_THREADS=0: ONNX Runtime picks the thread count; the engine arm too).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib.encoder import QUICK_SECONDS, SECONDS, SENTENCE, Engine
from bench.lib.harness import OUT, interleave, machine, work_folder, write
from bench.lib.loadgen import closed_loop, post
from bench.lib.mbuild import MINILM, build_mbuild, minilm_home
from bench.lib.servers import HOST, free_port, mbuild_serve, server, uvicorn_app
from runtimes.health import LIVE, READY
from tests.support.tiny_models import make_tiny_encoder

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "the serving layer's cost, against a bare app and its own engine"

CONCURRENCY = 16


def _request(port: int) -> bytes:
    return post(HOST, port, "/v1/embeddings", {"input": SENTENCE})


def _rate(port: int, concurrency: int, seconds: float) -> float:
    load = closed_loop(HOST, port, _request(port), concurrency, seconds)
    if load.failures:
        raise RuntimeError(f"port {port}: non-200 answers {load.failures}")
    return load.rate


def _p50(port: int, seconds: float) -> float:
    return closed_loop(HOST, port, _request(port), 1, seconds).p50_ms


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: one-second cases (it has no smaller model to take)."""
    work = work or work_folder("serving")
    seconds = QUICK_SECONDS if quick else SECONDS
    print(f"serving benchmark: builds in {work}, {repeats} interleaved rounds of {seconds:.0f}s per arm")
    tiny = build_mbuild(make_tiny_encoder(work / "tiny-encoder"), work / "tiny-build")
    env = minilm_home(work)
    minilm = build_mbuild(MINILM, work / "minilm-build", env)
    tiny_ms = Engine(tiny).call_ms()
    engine = Engine(minilm)
    ports = [free_port() for _ in range(3)]
    with (server(uvicorn_app("bench.peers.noop_app:app", ports[0]), LIVE, ports[0]) as bare,
          server(mbuild_serve(tiny.parent, ports[1]), READY, ports[1]) as small,
          server(mbuild_serve(minilm.parent, ports[2]), READY, ports[2], env) as served):
        for port in (bare, small, served):
            closed_loop(HOST, port, _request(port), CONCURRENCY, 1.0)  # warm connections, sessions, caches
        cases: list[tuple[str, Callable[[], float]]] = [
            ("bare req/s", partial(_rate, bare, CONCURRENCY, seconds)),
            ("tiny req/s", partial(_rate, small, CONCURRENCY, seconds)),
            ("bare p50", partial(_p50, bare, seconds)),
            ("tiny p50", partial(_p50, small, seconds)),
            ("minilm service", partial(_rate, served, CONCURRENCY, seconds)),
            ("minilm engine", partial(engine.sentences_per_second, CONCURRENCY, seconds)),
        ]
        results = interleave(cases, repeats)
    median = {name: series.median for name, series in results.items()}
    added = median["tiny p50"] - median["bare p50"]
    ratio = median["minilm service"] / median["minilm engine"]
    data: dict[str, Any] = {
        "scenario": "S1 serving cost", "machine": machine(), "seconds_per_run": seconds, "concurrency": CONCURRENCY,
        "tiny_engine_ms_per_call": tiny_ms, "p50_added_ms": added, "service_over_engine": ratio,
        "results": {name: {"values": s.values, "median": s.median} for name, s in results.items()}}
    rows = [
        f"| requests/s at c={CONCURRENCY} | {results['bare req/s'].median:.0f} ({results['bare req/s'].spread(0)}) | "
        f"{results['tiny req/s'].median:.0f} ({results['tiny req/s'].spread(0)}) | "
        f"{median['tiny req/s'] / median['bare req/s']:.2f}x |",
        f"| p50 ms at c=1 | {median['bare p50']:.2f} ({results['bare p50'].spread(2)}) | "
        f"{median['tiny p50']:.2f} ({results['tiny p50'].spread(2)}) | +{added:.2f} ms |",
    ]
    markdown = "\n".join([
        "# Serving cost", "", __doc__.strip(), "",
        f"Machine: {data['machine']['cores']} cores ({data['machine']['cpu']}); client and servers share it. "
        f"{repeats} interleaved rounds of {seconds:.0f}s per arm, median (min-max).", "",
        "## The service against a bare app", "",
        "| measure | bare Starlette/uvicorn | mbuild service, near-no-op engine | mbuild vs bare |",
        "| --- | ---: | ---: | ---: |", *rows, "",
        f"The near-no-op engine costs {tiny_ms:.2f} ms per call in-process, included in the mbuild column.", "",
        f"## MiniLM: the service against its own engine, concurrency {CONCURRENCY}", "",
        "| arm | sentences/s (median) | min-max |", "| --- | ---: | ---: |",
        f"| mbuild service, {CONCURRENCY} clients x 1 sentence | {median['minilm service']:.1f} | "
        f"{results['minilm service'].spread()} |",
        f"| engine in-process, {CONCURRENCY} at a time in batches of {engine.max_batch} | "
        f"{median['minilm engine']:.1f} | "
        f"{results['minilm engine'].spread()} |", "",
        f"Service / engine: **{ratio:.2f}** (target >= 0.8).", "",
        "Reproduce: `python -m bench serving` (writes docs/benchmarks/serving.json and serving.md).", ""])
    path = write("serving", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
