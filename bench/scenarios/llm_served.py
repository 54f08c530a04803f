"""Language model served over HTTP: mbuild against a naive transformers server, streaming at concurrency 1-16.

Arms, on the same random ~100M Llama, pinned to the same server cores with the same thread count:
  mbuild              `mbuild serve` of the model built with mbuild's default CPU profile (int8 weights and
                      compute), what a user gets: the runtime's continuous batching over ONNX Runtime
  naive transformers  bench/peers/naive_llm_app.py: FastAPI, `model.generate` with a TextIteratorStreamer in a
                      thread, one generation at a time under a lock (what a user writes in an hour)
Every request streams POST /v1/completions with a text prompt of 16-128 words and decodes exactly
NEW_TOKENS tokens, greedy (min_tokens = max_tokens). At concurrency 1, 4 requests one after another; at
concurrency c >= 4, one wave of c requests sent at once. The client (bench/lib/llm_client.py, httpx) runs on
its own core.
The client is our own, with vLLM's metric definitions (below): guidellm 0.8.1 installs here (with the CPU
torch installed first) and validates the server, but with `request_format=/v1/completions` (this random
model has no chat template for its default chat route) its workers sent no request, so it is not an arm.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib.harness import OUT, Series, interleave, machine, work_folder, write
from bench.lib.llm_client import Counter, run
from bench.lib.llm_models import make_llama_words, measured_shape, workload
from bench.lib.mbuild import build_mbuild
from bench.lib.plots import save_llm_plot
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores, uvicorn_app
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "a served language model against a naive transformers server"

NEW_TOKENS = 32
CONCURRENCY = (1, 4, 16)
SEQUENTIAL = 4  # requests at concurrency 1
ARMS = ("mbuild", "naive transformers")
METRICS = ("total_tok_s", "user_tok_s", "e2e_user_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")

def prompts(count: int) -> list[str]:
    """`count` prompts spread over 16-128 words; word "w<id>" is token <id> of the word-level tokenizer."""
    texts = [" ".join(f"w{i}" for i in ids) for ids in workload(16)]
    return texts[:: len(texts) // count][:count]


def words(text: str) -> int:
    """Tokens in a text of the word-level vocabulary: each decodes to one space-separated word, so counting
    words is re-tokenizing (as vLLM's client does) without loading the tokenizer into the client."""
    return len(text.split())


def body(prompt: str, model: str) -> dict[str, Any]:
    # ignore_eos as well as min_tokens so mbuild never stops early; the naive server ignores both extras
    # but its min_new_tokens does the same
    return {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


def _cases(urls: dict[str, str], model: str, count: Counter,
           runs: dict[str, list[dict[str, float]]]) -> list[tuple[str, Callable[[], float]]]:
    cases: list[tuple[str, Callable[[], float]]] = []
    for concurrency in CONCURRENCY:
        payloads = [body(p, model) for p in prompts(SEQUENTIAL if concurrency == 1 else concurrency)]
        for arm, url in urls.items():
            name = f"{arm} c={concurrency}"
            runs[name] = []
            cases.append((name, partial(run, url, payloads, concurrency, count, runs[name])))
    return cases


def measure(build: Path, model: Path, cores: tuple[set[int], set[int]],
            repeats: int) -> dict[str, list[dict[str, float]]]:
    """Both servers up at once, on the server cores; the client pinned to its own core while it drives them."""
    client_cpus, servers_cpus = cores
    threads = str(len(servers_cpus))
    ports = [free_port() for _ in ARMS]
    print(f"  servers on cores {sorted(servers_cpus)} with {threads} threads, client on {sorted(client_cpus)}")
    with (server(mbuild_serve(build, ports[0]), READY, ports[0], {"MBUILD_THREADS": threads},
                 cpus=servers_cpus),
          server(uvicorn_app("bench.peers.naive_llm_app:app", ports[1]), "/health", ports[1],
                 {"BENCH_MODEL_DIR": str(model), "BENCH_THREADS": threads}, cpus=servers_cpus),
          pinned(client_cpus)):
        urls = {arm: f"http://{HOST}:{port}/v1/completions" for arm, port in zip(ARMS, ports, strict=True)}
        runs: dict[str, list[dict[str, float]]] = {}
        cases = _cases(urls, served_name(ports[0]), words, runs)
        # one concurrency-4 wave per arm first, so first-call costs stay out of the rounds
        for name, warm in [case for case in cases if case[0].endswith(" c=4")]:
            print(f"  warm-up {name}: {warm():.1f} tokens/s")
            runs[name].clear()
        interleave(cases, repeats)
    return runs


def tabulate(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Series]]:
    return {name: {metric: Series([r[metric] for r in rounds]) for metric in METRICS} for name, rounds in runs.items()}


def _row(concurrency: int, arm: str, series: dict[str, Series], ratio: float | None) -> str:
    return (f"| {concurrency} | {arm} | {series['total_tok_s'].median:.1f} ({series['total_tok_s'].spread()}) | "
            f"{series['user_tok_s'].median:.1f} | {series['ttft_p50_ms'].median:.0f} | "
            f"{series['ttft_p99_ms'].median:.0f} | {series['tpot_p50_ms'].median:.1f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} |")


def plot(table: dict[str, dict[str, Series]], path: Path) -> None:
    points = {arm: [(c, table[f"{arm} c={c}"]["total_tok_s"].median, table[f"{arm} c={c}"]["user_tok_s"].median)
                    for c in CONCURRENCY] for arm in ARMS}
    save_llm_plot(points, f"Random ~100M Llama served, {NEW_TOKENS} new tokens per request", path)


def report(table: dict[str, dict[str, Series]], cores: tuple[set[int], set[int]],
           repeats: int) -> tuple[dict[str, Any], str]:
    client, servers = sorted(cores[0]), sorted(cores[1])
    data: dict[str, Any] = {"scenario": "L1 language model served", "new_tokens": NEW_TOKENS,
                            "cores": {"client": client, "servers": servers},
                            "machine": machine(), "repeats": repeats, "results": {}}
    rows = []
    for concurrency in CONCURRENCY:
        ours = table[f"mbuild c={concurrency}"]["total_tok_s"].median
        for arm in ARMS:
            name = f"{arm} c={concurrency}"
            series = table[name]
            ratio = None if arm == "mbuild" else ours / series["total_tok_s"].median
            data["results"][name] = {m: {"median": s.median, "values": s.values} for m, s in series.items()}
            if ratio is not None:
                data["results"][name]["mbuild_ratio"] = ratio
            rows.append(_row(concurrency, arm, series, ratio))
    markdown = "\n".join([
        "# Language model served: mbuild against a naive transformers server", "", __doc__.strip(), "",
        f"Machine: {data['machine']['cores']} cores ({data['machine']['cpu']}); servers on cores {servers} "
        f"with {len(servers)} intra-op thread(s), client on {client}. {repeats} interleaved "
        "rounds, arms alternating; median of the rounds (min-max for total tokens/s).", "",
        "| concurrency | arm | total tokens/s | per-user tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
        "mbuild / naive throughput |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |", *rows, "",
        "![Total output tokens/s against tokens/s per user](llm_served.png)", "",
        "Metrics, as vLLM's benchmark_serving defines them, per run:", "",
        "- TTFT: time from sending a request to its first streamed chunk with non-empty text. p99 over the run's "
        "4-16 requests is in effect their maximum.",
        "- TPOT: (end-to-end latency - TTFT) / (output tokens - 1) per request; the table gives the median.",
        "- Output tokens: mbuild's `usage.completion_tokens` (`stream_options.include_usage`); the naive server "
        "sends no usage, so its streamed text is counted in words, one per token of the word-level vocabulary "
        f"(the count vLLM's client gets by re-tokenizing). Every request is checked to produce exactly {NEW_TOKENS}.",
        "- Total tokens/s: all output tokens of the run / wall time from the first send to the last stream's end.",
        "- Per-user tokens/s: 1 / TPOT p50, the decode speed a user sees once the stream has started; waiting for "
        "a turn shows in TTFT instead. The JSON also has tokens / end-to-end latency per request "
        "(`e2e_user_tok_s`, median), which counts the wait.",
        "",
        "Reproduce: `python -m bench llm_served` (writes docs/benchmarks/llm_served.json, .md and .png).", ""])
    return data, markdown


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None) -> Path:
    """Quick: the tiny Llama instead of the ~100M one."""
    # the same folder as `python -m bench llm`: both build the same model the same way, so either reuses it
    work = work or work_folder("llm", quick)
    print(f"LLM served benchmark: models in {work}, {repeats} interleaved rounds, {NEW_TOKENS} new tokens a request")
    key, shape = measured_shape(quick)
    model = make_llama_words(work / f"llama-{key}", shape)
    build = build_mbuild(model, work / "mbuild-build-default", precision=None).parent
    cores = split_cores()
    table = tabulate(measure(build, model, cores, repeats))
    data, markdown = report(table, cores, repeats)
    path = write("llm_served", data, markdown, out, measures=MEASURES)
    plot(table, out / "llm_served.png")
    print(markdown)
    return path
