"""A cross-encoder reranker served by mbuild and by infinity-emb, one core each: pairs/s, latency, scores.

The model: the real all-MiniLM-L6-v2 body (cross-encoder/ms-marco-MiniLM-L6-v2's exact shape: 6 layers, hidden 384)
under a one-label classification head drawn from a seeded normal (bench/lib/rerank_model.py). The head is random:
scores are compared between servers, not ranking quality. Every arm serves that one folder's weights:
  mbuild                 `mbuild package` with the default profile and precision (what a user gets; fp32 for a
                         reranker on CPU), `mbuild serve`, POST /v1/rerank
  infinity torch         infinity-emb 0.0.78 `--engine torch` (sentence-transformers' CrossEncoder on PyTorch),
                         POST /rerank, its default batch of 32 pairs, in its own venv (bench/lib/infinity.py)
  infinity optimum       infinity-emb's `--engine optimum` (ONNX Runtime through optimum) on the same folder plus a
                         model.onnx exported offline by optimum's own exporter, as a Hub repo ships one
Every server is pinned to the same core with one thread (MBUILD_THREADS, OMP_NUM_THREADS); the closed-loop client
(bench/lib/loadgen.py) runs on the other core. A request is 1 query (13 words) x 32 seeded English-like passages of
128-256 tokens each (no pair near the 512-token limit of any arm, so none truncates), the same request every time
(no arm caches answers: infinity's cache is off by default and set off). Concurrency 1 and 16, the arms' cases
interleaved round by round; pairs/s = answered requests/s x 32, over the window and the in-flight requests' drain.
Scores: for that request, each arm's relevance scores (its Cohere route) and logits (mbuild's /v1/ranking,
infinity's `raw_scores`) against sentence-transformers' CrossEncoder.predict on PyTorch (sigmoid, and no
activation), with the order of the 32 passages by score against the reference's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib import infinity
from bench.lib.encoder import flops_per_sequence, op_shares
from bench.lib.harness import OUT, Series, fp32_peak_gflops, interleave, machine, rate_row, work_folder, write
from bench.lib.loadgen import Load, post
from bench.lib.mbuild import build_mbuild
from bench.lib.rerank_model import PASSAGE_TOKENS, Workload, head_facts, make_cross_encoder, workload
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, server, split_cores, timed_rate
from runtimes.bundle import load_engine_config
from runtimes.engines.encoder import EncoderEngine
from runtimes.health import READY
from runtimes.tokenize import PairTokenizer

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "a cross-encoder reranker served, against infinity-emb"

CONCURRENCY = (1, 16)
SECONDS = {1: 15.0, 16: 45.0}  # a c=16 request waits ~16 others (~25 s here): its window spans a few of them
QUICK_SECONDS = 1.0  # a quick run: one request per connection, enough to see every arm answer
GOAL = 1.5  # mbuild's pairs/s at c=16 against infinity's (--engine torch, the peer named by the issue)
PEER = "infinity torch"
# What a user of infinity-emb 0.0.78 gets besides its numbers, read in its source and seen here (2026-12-02)
PEER_NOTES = (
    "infinity's optimum engine sends no token_type_ids (its OptimumCrossEncoder tokenizes with "
    "`return_token_type_ids=False`, and optimum then feeds zeros), so the passage is read as the query's segment: "
    "that is where its scores part from the reference's (checked once, 2026-12-02: its logits were within 1e-5 of "
    "the same model's in transformers fed zero token_type_ids). Its graph optimization fails on the optimum-onnx 0.1 "
    "its extras install (`OptimizationConfig` no longer takes `optimize_with_onnxruntime_only`; it logs that and "
    "serves the unoptimized graph), and it starts only as `--model-id .` from inside the folder "
    "(bench/lib/infinity.py says why). Its torch engine's default BetterTransformer does not apply either: it needs "
    "optimum < 2, and infinity's optimum extra installs optimum 2.1.")


@dataclass
class Arm:
    name: str
    command: list[str]
    port: int
    ready: str
    route: str  # its Cohere-shaped rerank route
    env: dict[str, str]
    limit: int  # tokens a pair may hold before this server cuts it
    cwd: Path | None = None
    scores: dict[str, Any] = field(default_factory=dict)


def arms(work: Path, model: Path, threads: int) -> list[Arm]:
    offline = {"HF_HUB_OFFLINE": "1"}
    build = build_mbuild(model, work / "mbuild-default", offline, precision=None).parent  # no --precision: default
    engine = json.loads((build / "model" / "engine.json").read_text())
    port = free_port()
    found = [Arm("mbuild", mbuild_serve(build, port), port, READY, "/v1/rerank",
                 {**offline, "MBUILD_THREADS": str(threads)}, int(engine["max_seq_length"]))]
    infinity.ensure_venv()
    home = work / "infinity-home"
    # infinity's torch engine cuts at the tokenizer's model_max_length; its optimum engine at max_position_embeddings
    tokenizer_limit = int(json.loads((model / "tokenizer_config.json").read_text())["model_max_length"])
    positions = int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
    port = free_port()
    found.append(Arm(PEER, infinity.serve(str(model), model.name, port), port, infinity.READY, "/rerank",
                     infinity.env(home, threads), tokenizer_limit))
    port = free_port()
    command, cwd = infinity.serve_onnx(infinity.onnx_folder(model, work / "cross-encoder-onnx"), port)
    found.append(Arm("infinity optimum", command, port, infinity.READY, "/rerank", infinity.env(home, threads),
                     positions, cwd))
    return found


def reference(model: Path, load: Workload) -> tuple[np.ndarray, np.ndarray]:
    """sentence-transformers' CrossEncoder on PyTorch: (logits, relevance scores with its default sigmoid)."""
    import torch
    from sentence_transformers import CrossEncoder

    encoder = CrossEncoder(str(model), device="cpu")
    pairs = [(load.query, passage) for passage in load.passages]
    logits = np.asarray(encoder.predict(pairs, activation_fn=torch.nn.Identity()), dtype=np.float64)
    return logits, np.asarray(encoder.predict(pairs), dtype=np.float64)


def _by_index(results: list[dict[str, Any]], key: str, count: int) -> np.ndarray:
    values = np.full(count, np.nan)
    for row in results:
        values[int(row["index"])] = float(row[key])
    return values


def compare(arm: Arm, load: Workload, logits: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """This arm's answers to the benchmark request against the reference's."""
    base, count = f"http://{HOST}:{arm.port}", len(load.passages)
    answer = httpx.post(base + arm.route, json=load.body(), timeout=300).json()
    got = _by_index(answer["results"], "relevance_score", count)
    if arm.name == "mbuild":  # its logits: NIM's /v1/ranking; and its token count shows nothing was cut
        raw = httpx.post(f"{base}/v1/ranking", timeout=300, json={
            "query": {"text": load.query}, "passages": [{"text": p} for p in load.passages]}).json()["rankings"]
        got_logits = _by_index(raw, "logit", count)
        if answer["usage"]["prompt_tokens"] != sum(load.pair_tokens):
            raise RuntimeError(f"mbuild counted {answer['usage']['prompt_tokens']} tokens, not "
                               f"{sum(load.pair_tokens)}: it cut or changed a pair")
    else:
        raw = httpx.post(base + arm.route, json={**load.body(), "raw_scores": True}, timeout=300).json()["results"]
        got_logits = _by_index(raw, "relevance_score", count)
    order = [int(row["index"]) for row in answer["results"]]  # as the server ranked them, best first
    wanted = sorted(range(count), key=lambda i: -scores[i])
    return {"max_score_error": float(np.max(np.abs(got - scores))),
            "max_logit_error": float(np.max(np.abs(got_logits - logits))),
            "order_equal": order == wanted, "ranks_moved": sum(a != b for a, b in zip(order, wanted, strict=True))}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: one round of one-second windows (each c=16 case still waits for its 16 requests' answers)."""
    work = work or work_folder("rerank")  # one model for both sizes: a quick run reuses the full run's build
    model = make_cross_encoder(work / "cross-encoder")
    load = workload(model)
    client, servers = split_cores()
    threads = len(servers)
    seconds = dict.fromkeys(CONCURRENCY, QUICK_SECONDS) if quick else SECONDS
    print(f"rerank benchmark: work in {work}; servers on cores {sorted(servers)} with {threads} thread(s), client "
          f"on {sorted(client)}; {repeats} interleaved round(s), windows {seconds} s", flush=True)
    found = arms(work, model, threads)
    if longest := [a.name for a in found if max(load.pair_tokens) > a.limit]:
        raise RuntimeError(f"the longest pair ({max(load.pair_tokens)} tokens) would be cut by {longest}")
    logits, scores = reference(model, load)
    loads: dict[str, list[Load]] = {}
    cases: list[tuple[str, Callable[[], float]]] = []
    with ExitStack() as stack:
        for arm in found:
            stack.enter_context(server(arm.command, arm.ready, arm.port, arm.env, cpus=servers, cwd=arm.cwd))
            arm.scores = compare(arm, load, logits, scores)  # also its warm-up
            request = post(HOST, arm.port, arm.route, load.body())
            for concurrency in CONCURRENCY:
                name = f"{arm.name} c={concurrency}"
                loads[name] = []
                cases.append((name, partial(timed_rate, arm.name, arm.port, request, concurrency, client, loads[name],
                                            seconds[concurrency], len(load.passages))))
        results = interleave(cases, repeats)
    with pinned(servers):  # the floor: the servers' core's fp32 matmul peak, with their thread count
        peak = fp32_peak_gflops(threads, ((512, 512, 512),), 2) if quick else fp32_peak_gflops(threads)
    command = "python -m bench rerank" + (" --quick" if quick else "" if repeats == 3 else f" --repeats {repeats}")
    data = summary(found, results, loads, load, model, repeats, seconds, command)
    config = json.loads((model / "config.json").read_text())
    data["floor"] = floor(data["rows"], [flops_per_sequence(config, tokens) for tokens in load.pair_tokens], peak)
    with pinned(servers):
        data["floor"]["mbuild_op_shares"] = mbuild_op_shares(work / "mbuild-default" / "model", load, threads, work)
    data["floor"].update(ceiling(data["floor"]))
    path = write("rerank", data, render(data, quick), out, measures=MEASURES)
    print(path.read_text())
    return path


def summary(found: list[Arm], results: dict[str, Series], loads: dict[str, list[Load]], load: Workload,
            model: Path, repeats: int, seconds: dict[int, float], command: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for arm in found:
        for concurrency in CONCURRENCY:
            name, runs = f"{arm.name} c={concurrency}", loads[f"{arm.name} c={concurrency}"]
            rows[name] = rate_row(arm.name, concurrency, results[name], runs, "pairs")
    top = max(CONCURRENCY)
    ratios = {arm.name: rows[f"mbuild c={top}"]["pairs_per_s_median"] / rows[f"{arm.name} c={top}"][
        "pairs_per_s_median"] for arm in found if arm.name != "mbuild"}
    return {"scenario": "rerank: mbuild against infinity-emb", "machine": machine(), "infinity_emb": infinity.VERSION,
            "command": command, "repeats": repeats, "seconds_per_window": {str(c): s for c, s in seconds.items()},
            "request": {"passages": len(load.passages), "query_words": len(load.query.split()),
                        "passage_tokens": load.passage_tokens, "pair_tokens_max": max(load.pair_tokens),
                        "pair_limits": {arm.name: arm.limit for arm in found}},
            "head": head_facts(model), "rows": rows, "scores": {arm.name: arm.scores for arm in found},
            "mbuild_vs": ratios, "goal": {"wanted": GOAL, "peer": PEER, "measured": ratios[PEER]}}


def floor(rows: dict[str, Any], pair_flops: list[float], peak: float) -> dict[str, Any]:
    """What each arm's pairs/s at c=16 is in matmul GFLOP/s (the request's pairs at their own lengths, no padding
    counted), against the fp32 peak measured on the servers' core: how far above the hardware's floor it runs."""
    per_pair = float(np.mean(pair_flops))
    top = max(CONCURRENCY)
    achieved = {row["arm"]: per_pair * row["pairs_per_s_median"] / 1e9 for row in rows.values()
                if row["concurrency"] == top}
    return {"flops_per_pair": per_pair, "peak_fp32_gflops": peak, "gflops_at_c16": achieved,
            "share_of_peak": {arm: value / peak for arm, value in achieved.items()}}


MATMUL_OPS = {"MatMul", "FusedMatMul", "Gemm", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulNBits"}


def mbuild_op_shares(engine_dir: Path, load: Workload, threads: int, work: Path) -> dict[str, float]:
    """Where mbuild's engine spends its time on the benchmark's request, run as the batcher runs it (the pairs by
    length, max_batch a call), twice."""
    config = load_engine_config(engine_dir)
    pairs = sorted(PairTokenizer.of_engine(engine_dir, config).encode([(load.query, p) for p in load.passages]),
                   key=len)
    step = config.batching.max_batch

    def run(engine: EncoderEngine) -> None:
        for _ in range(2):
            for start in range(0, len(pairs), step):
                engine.score(pairs[start : start + step])

    return op_shares(engine_dir, run, threads, work)


def ceiling(found: dict[str, Any]) -> dict[str, float]:
    """What the goal asks of the floor: the share of the fp32 peak mbuild would need (the goal x the peer's share),
    and a lower bound on what its matmul kernels reach inside their own time (its served share over the matmuls'
    share of the engine's time)."""
    matmul = sum(share for op, share in found["mbuild_op_shares"].items() if op in MATMUL_OPS)
    return {"mbuild_matmul_time_share": matmul,
            "mbuild_matmul_kernels_share_of_peak": found["share_of_peak"]["mbuild"] / matmul,
            "goal_needs_share_of_peak": GOAL * found["share_of_peak"][PEER]}


def _ms(value: float) -> str:
    return "-" if np.isnan(value) else f"{value:.0f}"  # a percentile of too few requests (a quick run's) is nan


def render(data: dict[str, Any], quick: bool) -> str:
    rows, m, request = data["rows"], data["machine"], data["request"]
    table = ["| arm | c | pairs/s (median, min-max) | requests/s | p50 ms | p99 ms | requests timed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows.values():
        values = row["pairs_per_s"]
        table.append(f"| {row['arm']} | {row['concurrency']} | {row['pairs_per_s_median']:.1f} "
                     f"({min(values):.1f}-{max(values):.1f}) | {row['pairs_per_s_median'] / request['passages']:.2f} "
                     f"| {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | {row['requests']} |")
    goal = data["goal"]
    met = "met" if goal["measured"] >= goal["wanted"] else "**behind**"
    ratios = "; ".join(f"{ratio:.2f}x {name}'s" for name, ratio in data["mbuild_vs"].items())
    scores = ["| arm | max abs score error | max abs logit error | order of the 32 equals the reference's |",
              "| --- | ---: | ---: | --- |"]
    for name, found in data["scores"].items():
        order = "yes" if found["order_equal"] else f"no ({found['ranks_moved']} of {request['passages']} ranks differ)"
        scores.append(f"| {name} | {found['max_score_error']:.2e} | {found['max_logit_error']:.2e} | {order} |")
    head, tokens = data["head"], request["passage_tokens"]
    where = "a check that it runs, written to a scratch folder" if quick else "writes docs/benchmarks/rerank.{json,md}"
    limits = ", ".join(f"{name} {limit}" for name, limit in request["pair_limits"].items())
    return "\n".join([
        "# Rerank: mbuild against infinity-emb" + (" (quick: not a result)" if quick else ""), "",
        f"Command: `{data['command']}` ({where}). Machine: {m['cpu']}, "
        f"{m['cores']} cores, Python {m['python']}, {m['date']}; infinity-emb {data['infinity_emb']}. "
        f"{data['repeats']} interleaved round(s), windows of {data['seconds_per_window']} s by concurrency; pairs/s "
        "is the median of the rounds, p50/p99 the median of the rounds' percentiles.", "",
        "## Goal", "",
        f"mbuild's pairs/s at c=16: **{goal['measured']:.2f}x** {goal['peer']}'s, against a goal of >= "
        f"{goal['wanted']:.1f}x: {met}" + (" (a quick run: not a result)" if quick else "") + f". All: {ratios}.", "",
        "## Throughput and latency", "", *table, "",
        "## Against the core's floor", "",
        f"Matmul FLOPs a pair takes, averaged over the request's pairs at their own lengths: "
        f"{data['floor']['flops_per_pair'] / 1e9:.2f} GFLOP. The fp32 matmul peak measured on the servers' core: "
        f"{data['floor']['peak_fp32_gflops']:.1f} GFLOP/s (bench/lib/harness.py's fp32_peak_gflops).", "",
        "| arm at c=16 | GFLOP/s achieved | share of the fp32 peak |", "| --- | ---: | ---: |",
        *[f"| {arm} | {value:.1f} | {data['floor']['share_of_peak'][arm]:.0%} |"
          for arm, value in data["floor"]["gflops_at_c16"].items()], "",
        f"The goal asks mbuild for {data['floor']['goal_needs_share_of_peak']:.0%} of the fp32 peak ({GOAL}x "
        f"{PEER}'s share). ONNX Runtime's profiler on mbuild's engine, run on the request as the batcher runs it: "
        f"matmuls take {data['floor']['mbuild_matmul_time_share']:.0%} of its kernel time, so inside that time they "
        f"run at {data['floor']['mbuild_matmul_kernels_share_of_peak']:.0%} of the peak or more (the served rate "
        "also pays for HTTP and tokenizing on the same core); the other kernels: "
        + ", ".join(f"{op} {share:.1%}" for op, share in list(data["floor"]["mbuild_op_shares"].items())[:6]
                    if op not in MATMUL_OPS) + ".", "",
        "## Scores", "",
        "Against sentence-transformers' CrossEncoder.predict on PyTorch (relevance score: its default sigmoid; logit: "
        "no activation), on the benchmark's request. The head is random, so this compares servers, not quality.", "",
        *scores, "",
        PEER_NOTES, "",
        "## The model and the request", "",
        f"Head: seeded normal, std {head['weight_std']:.2f}, bias {head['bias']:.2f}, scaled so the request's logits "
        f"have std {head['request_logits']['std']:.2f} (from {head['request_logits']['min']:.2f} to "
        f"{head['request_logits']['max']:.2f}). Request: 1 query of {request['query_words']} words x "
        f"{request['passages']} passages of {min(tokens)}-{max(tokens)} tokens (drawn in {PASSAGE_TOKENS[0]}-"
        f"{PASSAGE_TOKENS[1]}); the longest pair is {request['pair_tokens_max']} tokens, under every arm's limit "
        f"({limits}), so none cuts a pair.", "",
        "How it was measured (bench/scenarios/rerank.py):", "", "```", (__doc__ or "").strip(), "```", ""])
