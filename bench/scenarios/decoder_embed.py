"""A decoder-body embedder (Qwen3-Embedding's kind) served by mbuild and by infinity-emb, one core each.

The model: Qwen3-Embedding-0.6B's layers, 4 of its 28, seeded random, laid out as Qwen3-Embedding ships (last-token
pooling, Normalize, instruction prompts; bench/lib/decoder_embed_model.py). Every arm serves that one folder:
  mbuild           `mbuild package` with the default profile and precision (what a user gets; fp32 for an embedder
                   on CPU), `mbuild serve`, POST /v1/embeddings
  infinity torch   infinity-emb 0.0.78 `--engine torch` (sentence-transformers on PyTorch), POST /embeddings, its
                   default batch of 32, in its own venv (bench/lib/infinity.py)
infinity's optimum engine is left out: it loads a feature-extraction ONNX export and pools it itself, with no
last-token pooling. Every server is pinned to the same core with one thread; the closed-loop client
(bench/lib/loadgen.py) runs on the other core. A request embeds 4 seeded English-like passages of 128-256 tokens
(a document's chunks, as a RAG indexer sends them; no prompt, as for documents), the same request every time.
Concurrency 1 and 16, the arms' cases interleaved round by round; passages/s = answered requests/s x 4.
Embeddings: each arm's for that request against sentence-transformers' encode on PyTorch (cosine).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib import infinity
from bench.lib.decoder_embed_model import LAYERS, make_decoder_embedder
from bench.lib.harness import OUT, Series, interleave, machine, rate_row, work_folder, write
from bench.lib.loadgen import Load, post
from bench.lib.mbuild import build_mbuild
from bench.lib.rerank_model import workload
from bench.lib.servers import HOST, free_port, mbuild_serve, server, split_cores, timed_rate
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "a decoder-body embedder served, against infinity-emb"

CONCURRENCY = (1, 16)
SECONDS = {1: 15.0, 16: 45.0}
QUICK_SECONDS = 1.0
PASSAGES = 4
PEER = "infinity torch"


@dataclass
class Arm:
    name: str
    command: list[str]
    port: int
    ready: str
    route: str
    env: dict[str, str]
    model: str | None  # the name a request gives (None: mbuild's one served model)
    min_cosine: float = float("nan")


def arms(work: Path, model: Path, threads: int) -> list[Arm]:
    offline = {"HF_HUB_OFFLINE": "1"}
    build = build_mbuild(model, work / "mbuild-default", offline, precision=None).parent  # the default profile
    port = free_port()
    found = [Arm("mbuild", mbuild_serve(build, port), port, READY, "/v1/embeddings",
                 {**offline, "MBUILD_THREADS": str(threads)}, None)]
    infinity.ensure_venv()
    port = free_port()
    found.append(Arm(PEER, infinity.serve(str(model), model.name, port), port, infinity.READY, "/embeddings",
                     infinity.env(work / "infinity-home", threads), model.name))
    return found


def reference(model: Path, passages: list[str]) -> np.ndarray:
    """sentence-transformers on PyTorch, as a user of the model card would embed documents."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(str(model), device="cpu")
    return np.asarray(encoder.encode(passages, normalize_embeddings=True), dtype=np.float64)


def body(arm: Arm, passages: list[str]) -> dict[str, Any]:
    return {"input": passages, **({"model": arm.model} if arm.model else {})}


def min_cosine(arm: Arm, passages: list[str], want: np.ndarray) -> float:
    answer = httpx.post(f"http://{HOST}:{arm.port}{arm.route}", json=body(arm, passages),
                        timeout=300).json()
    got = np.array([row["embedding"] for row in sorted(answer["data"], key=lambda r: r["index"])], dtype=np.float64)
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    return float(np.min((got * want).sum(axis=1)))


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: one round of one-second windows."""
    work = work or work_folder("decoder_embed")
    model = make_decoder_embedder(work / "qwen3-embedder")
    load = workload(model, PASSAGES)
    passages = load.passages
    client, servers = split_cores()
    threads = len(servers)
    seconds = dict.fromkeys(CONCURRENCY, QUICK_SECONDS) if quick else SECONDS
    print(f"decoder_embed benchmark: work in {work}; servers on cores {sorted(servers)} with {threads} thread(s), "
          f"client on {sorted(client)}; {repeats} interleaved round(s), windows {seconds} s", flush=True)
    found = arms(work, model, threads)
    want = reference(model, passages)
    loads: dict[str, list[Load]] = {}
    cases: list[tuple[str, Callable[[], float]]] = []
    with ExitStack() as stack:
        for arm in found:
            stack.enter_context(server(arm.command, arm.ready, arm.port, arm.env, cpus=servers))
            arm.min_cosine = min_cosine(arm, passages, want)  # also its warm-up
            request = post(HOST, arm.port, arm.route, body(arm, passages))
            for concurrency in CONCURRENCY:
                name = f"{arm.name} c={concurrency}"
                loads[name] = []
                cases.append((name, partial(timed_rate, arm.name, arm.port, request, concurrency, client, loads[name],
                                            seconds[concurrency], PASSAGES)))
        results = interleave(cases, repeats)
    command = "python -m bench decoder_embed" + (" --quick" if quick else "" if repeats == 3 else
                                                 f" --repeats {repeats}")
    data = summary(found, results, loads, repeats, seconds, command, load.passage_tokens)
    path = write("decoder_embed", data, render(data, quick), out, measures=MEASURES)
    print(path.read_text())
    return path


def summary(found: list[Arm], results: dict[str, Series], loads: dict[str, list[Load]], repeats: int,
            seconds: dict[int, float], command: str, tokens: list[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for arm in found:
        for concurrency in CONCURRENCY:
            name, runs = f"{arm.name} c={concurrency}", loads[f"{arm.name} c={concurrency}"]
            rows[name] = rate_row(arm.name, concurrency, results[name], runs, "passages")
    ratios = {f"c={c}": rows[f"mbuild c={c}"]["passages_per_s_median"] / rows[f"{PEER} c={c}"][
        "passages_per_s_median"] for c in CONCURRENCY}
    return {"scenario": "decoder_embed: mbuild against infinity-emb", "machine": machine(),
            "infinity_emb": infinity.VERSION, "command": command, "repeats": repeats, "layers": LAYERS,
            "seconds_per_window": {str(c): s for c, s in seconds.items()},
            "request": {"passages": PASSAGES, "passage_tokens": tokens}, "rows": rows,
            "min_cosine": {arm.name: arm.min_cosine for arm in found}, "mbuild_vs_peer": ratios}


def _ms(value: float) -> str:
    return "-" if np.isnan(value) else f"{value:.0f}"


def render(data: dict[str, Any], quick: bool) -> str:
    m = data["machine"]
    table = ["| arm | c | passages/s (median, min-max) | p50 ms | p99 ms | requests timed | min cosine |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in data["rows"].values():
        values = row["passages_per_s"]
        table.append(f"| {row['arm']} | {row['concurrency']} | {row['passages_per_s_median']:.2f} "
                     f"({min(values):.2f}-{max(values):.2f}) | {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | "
                     f"{row['requests']} | {data['min_cosine'][row['arm']]:.6f} |")
    ratios = ", ".join(f"{ratio:.2f}x at {c}" for c, ratio in data["mbuild_vs_peer"].items())
    where = ("a check that it runs, written to a scratch folder" if quick
             else "writes docs/benchmarks/decoder_embed.{json,md}")
    return "\n".join([
        "# Decoder-body embeddings: mbuild against infinity-emb" + (" (quick: not a result)" if quick else ""), "",
        f"Command: `{data['command']}` ({where}). Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
        f"{m['date']}; infinity-emb {data['infinity_emb']}. {data['repeats']} interleaved round(s), windows of "
        f"{data['seconds_per_window']} s by concurrency; passages/s is the median of the rounds, p50/p99 the "
        "median of the rounds' percentiles.", "",
        f"mbuild's passages/s against {PEER}'s: **{ratios}**.", "",
        *table, "",
        f"Request: {data['request']['passages']} passages of {data['request']['passage_tokens']} tokens. Min cosine: "
        "each arm's embeddings of that request against sentence-transformers' encode on PyTorch.", "",
        "How it was measured (bench/scenarios/decoder_embed.py):", "", "```", (__doc__ or "").strip(), "```", ""])
