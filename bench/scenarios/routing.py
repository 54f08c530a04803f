"""Routing across replicas: Dynamo's KV router against round-robin, on users chatting over their own documents.

Model: the ~100M random Llama on its word-level tokenizer (bench/lib/llm_models.py; every "w<id>" one token), the
default build (`mbuild package --gpu cpu`). Load (bench/lib/routing_load.py): 32 users unless `--users U`, each with
their own 1024-token document, 12 turns each unless `--turns N` (document + history + a 16-token question, 32 greedy
answer tokens), user u starting at u s, a pause of 0.5-2.5 s (seeded per user, the same in every arm) between an
answer and the next turn. 32 users' documents and histories (about 48k tokens by the last turns) outgrow one replica's
KV pool (32,768 tokens: 16 slots of 2,048) and fit two: what a router that sends each conversation where it is held
is for. The control: the same schedule with every prompt fresh (nothing to reuse), 4 turns a user. Arms, each alone
on the host, two replicas on one core each (the client shares the host's two cores with them: there is no third):
  dynamo kv           `mbuild serve BUILD --replicas 2 --router kv`: Dynamo's frontend and KV router, the replicas'
                      prefix caches published as KV events; the image's frontend weighs a CPU replica's prompt
                      blocks to prefill 16 times the blocks its running sequences hold (runtimes/dynamo/frontend.py)
  dynamo kv 1:1       the same with Dynamo's own weighing (DYN_ROUTER_PREFILL_LOAD_SCALE=1), documents only
  dynamo round-robin  the same with `--router round-robin`
  proxy round-robin   two `mbuild serve` (one core, MBUILD_THREADS=1 each) behind a plain round-robin proxy
                      (bench/lib/routing_load.py's app), as a Kubernetes Service spreads requests; documents only
  one replica         one `mbuild serve` on one core; documents only
Every replica has mbuild's default prefix cache (a sequence's prefix kept in its slot; copies up to 1024 MB).
"""

from __future__ import annotations

import argparse
import re
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.lib.harness import OUT, machine, work_folder, write
from bench.lib.llm_models import LLAMA_100M, LLAMA_TINY, make_llama_words
from bench.lib.mbuild import MBUILD, build_mbuild, source_hash
from bench.lib.routing_load import Workload, run, summarize
from bench.lib.servers import HOST, dynamo_frontend, free_port, served_name, server, uvicorn_app
from runtimes.health import METRICS, READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "Dynamo's KV router against round-robin, two replicas"

ARMS = ("dynamo kv", "dynamo kv 1:1", "dynamo round-robin", "proxy round-robin", "one replica")
SCALE_1_1 = {"DYN_ROUTER_PREFILL_LOAD_SCALE": "1"}  # Dynamo's own weighing of prefill against load
CONTROL_ARMS = ("dynamo kv", "dynamo round-robin")  # the control's one question: nothing shared, nothing lost
CONTROL_TURNS = 4  # its prompts are all prefilled, in every arm: fewer turns keep its run as long as the documents'

TURNS, USERS = 12, 32  # by default; 32 users' documents and histories outgrow one replica's KV pool, not two
COUNTERS = {"hit": "mbuild_prefix_cache_hit_tokens_total", "query": "mbuild_prefix_cache_query_tokens_total",
            "routed": "dynamo_component_router_kv_selected_cached_prefix_tokens_total"}


def _counter(url: str, name: str) -> float:
    text = httpx.get(url, timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{.*}})? (\S+)$", text, re.M))


def _up(stack: ExitStack, arm: str, build: Path) -> tuple[str, list[str]]:
    """The arm's completions URL and the metrics URLs its hit rate is read from."""
    port = free_port()
    base = f"http://{HOST}:{port}"
    if arm.startswith("dynamo"):
        front = dynamo_frontend(stack, build, "--replicas", "2", "--router", arm.split()[1],
                                env=SCALE_1_1 if arm.endswith("1:1") else None)
        return f"{front}/v1/completions", [f"{front}/metrics"] if " kv" in arm else []
    backends = []
    for core in ([0, 1] if arm.startswith("proxy") else [1]):
        own = free_port()
        stack.enter_context(server([*MBUILD, "serve", str(build), "--host", HOST, "--port", str(own)],
                                   READY, own, {"MBUILD_THREADS": "1"}, cpus={core}))
        backends.append(f"http://{HOST}:{own}")
    if arm == "one replica":
        return f"{backends[0]}/v1/completions", [backends[0] + METRICS]
    stack.enter_context(server(uvicorn_app("bench.lib.routing_load:app", port), "/v1/models", port,
                               {"ROUTING_BACKENDS": ",".join(backends)}))
    return f"{base}/v1/completions", [b + METRICS for b in backends]


def _hit_rate(arm: str, metrics: list[str], before: dict[str, float], prompt_tokens: int) -> float | None:
    if not metrics:
        return None
    now = {key: sum(_counter(url, name) for url in metrics) for key, name in COUNTERS.items()}
    if arm.startswith("dynamo kv"):
        return (now["routed"] - before["routed"]) / prompt_tokens
    return (now["hit"] - before["hit"]) / max(now["query"] - before["query"], 1)


def arms_of(load: Workload) -> tuple[str, ...]:
    return ARMS if load.shared else CONTROL_ARMS


def measure(build: Path, loads: tuple[Workload, ...], repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for arm in ARMS:
        with ExitStack() as stack:
            url, metrics = _up(stack, arm, build)
            model = served_name(int(url.split(":")[2].split("/")[0]))
            for load in (load for load in loads if arm in arms_of(load)):
                for round_ in range(repeats):
                    before = {key: sum(_counter(u, name) for u in metrics) for key, name in COUNTERS.items()}
                    turns, wall = run(url, model, load, seed=round_)
                    found = summarize(turns, wall)
                    found["prefix_hit_rate"] = _hit_rate(arm, metrics, before, sum(t.prompt_tokens for t in turns))
                    results.setdefault(f"{load.key} {arm}", []).append(found)
                    print(f"  {load.key} {arm} round {round_ + 1}: TTFT p50 {found['ttft_p50_ms']:.0f} ms, p90 "
                          f"{found['ttft_p90_ms']:.0f} ms, {found['output_tok_s']:.1f} tokens/s", flush=True)
    return results


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def report(results: dict[str, Any], loads: tuple[Workload, ...], repeats: int, command: str,
           quick: bool) -> tuple[dict[str, Any], str]:
    lines = ["| workload | arm | TTFT p50 ms | TTFT p90 ms | later turns' TTFT p50 ms | TPOT p50 ms | output tokens/s "
             "| prefix hit rate |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    ratios: dict[str, Any] = {}
    for load in loads:
        for arm in arms_of(load):
            rounds = results[f"{load.key} {arm}"]
            cells = [_median(rounds, k) for k in ("ttft_p50_ms", "ttft_p90_ms", "later_turns_ttft_p50_ms",
                                                   "tpot_p50_ms", "output_tok_s", "prefix_hit_rate")]
            lines.append(f"| {load.key} | {arm} | " + " | ".join("-" if c is None else f"{c:.2f}" if i == 5
                                                                  else f"{c:.0f}" if i < 4 else f"{c:.1f}"
                                                                  for i, c in enumerate(cells)) + " |")
        kv, rr = results[f"{load.key} dynamo kv"], results[f"{load.key} dynamo round-robin"]
        proxy = results.get(f"{load.key} proxy round-robin", [])
        ratios[load.key] = {
            "kv_over_rr_ttft_p90": _ratio(kv, rr, "ttft_p90_ms"), "kv_over_rr_tok_s": _ratio(kv, rr, "output_tok_s"),
            "kv_over_proxy_ttft_p90": _ratio(kv, proxy, "ttft_p90_ms"),
            "kv_over_proxy_tok_s": _ratio(kv, proxy, "output_tok_s")}
    docs, fresh = ratios["documents"], ratios["fresh"]
    even = results["documents dynamo kv 1:1"]
    targets = [f"- documents: KV router's TTFT p90 / Dynamo round-robin's {docs['kv_over_rr_ttft_p90']:.2f} (target "
               f"<= 0.5), / the proxy's {docs['kv_over_proxy_ttft_p90']:.2f}; output tokens/s "
               f"{docs['kv_over_rr_tok_s']:.2f}x round-robin's (target >= 1.2), {docs['kv_over_proxy_tok_s']:.2f}x "
               "the proxy's.",
               f"- documents, Dynamo's 1:1 weighing: TTFT p90 / round-robin's "
               f"{_ratio(even, results['documents dynamo round-robin'], 'ttft_p90_ms'):.2f}, output tokens/s "
               f"{_ratio(even, results['documents dynamo round-robin'], 'output_tok_s'):.2f}x.",
               f"- fresh prompts: KV router's output tokens/s {fresh['kv_over_rr_tok_s']:.2f}x round-robin's "
               f"(target >= 0.95), TTFT p90 ratio {fresh['kv_over_rr_ttft_p90']:.2f}."]
    m = machine()
    markdown = "\n".join(["# Routing across replicas: Dynamo's KV router against round-robin"
                          + (" (quick smoke run)" if quick else ""), "", (__doc__ or "").strip(), "",
                          f"Machine: {m['cores']} cores ({m['cpu']}), {m['date']}; {loads[0].users} users of "
                          f"{loads[0].turns} turns (the control: {loads[1].turns}); {repeats} round(s) of each "
                          "workload per arm, medians shown.", "",
                          "## Targets", "", *targets, "", "## Results", "",
                          *lines, "", "Prefix hit rate: the replicas' prefix-cache hit tokens over the prompt tokens "
                          "they looked up; for the KV router, the cached prefix tokens it routed to over all prompt "
                          "tokens (Dynamo's round-robin reports none).", "", f"Reproduce: `{command}`.", ""])
    data = {"scenario": "routing", "machine": m, "command": command, "repeats": repeats, "quick": quick,
            "results": results, "ratios": ratios}
    return data, markdown


def _ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str) -> float:
    a, b = _median(ours, key), _median(theirs, key)
    return a / b if a is not None and b else float("nan")


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench routing`."""
    parser = argparse.ArgumentParser(prog="python -m bench routing")
    parser.add_argument("--turns", type=int, default=TURNS, choices=range(2, 21), metavar="2..20",
                        help="turns per user (default: %(default)s)")
    parser.add_argument("--users", type=int, default=USERS, choices=range(2, 129), metavar="2..128",
                        help="users (default: %(default)s); another count or turns reports to routing-Uu-Tt.md")
    options = parser.parse_args(argv)
    return {"turns": options.turns, "users": options.users}


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None, turns: int = TURNS,
         users: int = USERS) -> Path:
    """`python -m bench routing [--turns N] [--users U]`. Quick: the tiny Llama, 4 users of 2 turns, one round, into a
    scratch folder."""
    work = work or work_folder("routing", quick)
    work.mkdir(parents=True, exist_ok=True)
    key, shape = ("tiny", LLAMA_TINY) if quick else ("100m", LLAMA_100M)
    model = make_llama_words(work / f"llama-{key}-words", shape)
    build = build_mbuild(model, work / f"mbuild-{model.name}-{source_hash()}", precision=None).parent
    count = 4 if quick else users
    loads = (Workload(users=count, turns=2 if quick else turns, shared=True),
             Workload(users=count, turns=2 if quick else min(turns, CONTROL_TURNS), shared=False))
    rounds = 1 if quick else repeats
    print(f"routing: {model.name}, build {build}, {rounds} round(s)", flush=True)
    results = measure(build, loads, rounds)
    usual = quick or (turns, users) == (TURNS, USERS)
    command = f"python -m bench routing {'--quick' if quick else f'--repeats {repeats}'}" + (
        "" if usual else f" --turns {turns} --users {users}")
    data, markdown = report(results, loads, rounds, command, quick)
    path = write("routing" if usual else f"routing-{users}u-{turns}t", data, markdown, out, measures=MEASURES)
    print(markdown)
    return path
