"""One precision pair of the llama.cpp comparisons served and measured: an mbuild server and a llama-server of the
same weights on one pinned core, their cases interleaved, with the checks on the way (prompt lengths as both
servers count them; greedy agreement for fp32 / f32; shared-prefix TTFT on the pair a run names).

The results dict it fills: builds, ungated, runs (each case's rounds), greedy and prefix; prefix_pair names the pair
whose shared-prefix TTFT is measured, by shape key.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib import llamacpp
from bench.lib.harness import interleave
from bench.lib.llm_client import run
from bench.lib.llm_peer_checks import PROMPT_TOKENS, Texts, greedy, prefix_ttft
from bench.lib.llm_peer_shapes import Shape
from bench.lib.mbuild import build_or_engine
from bench.lib.servers import HOST, free_port, mbuild_serve, pinned, served_name, server, split_cores
from runtimes.health import READY

PREFIX_SEED = 10_000  # prefix texts never collide with the throughput prompts (seeds 0..)


def build_arms(model: Path, work: Path, precisions: list[str], key: str, results: dict[str, Any],
               env: dict[str, str] | None = None) -> dict[str, Path | str]:
    """mbuild's build of `model` in each precision, or why it did not build, noted in results["builds"][key]; an
    engine that only missed its gate is served as built, the gate's summary in results["ungated"][key]."""
    builds: dict[str, Path | str] = {}
    for precision in precisions:
        builds[precision], gate = build_or_engine(model, work, precision, env)
        if gate is not None:
            results["ungated"].setdefault(key, {})[precision] = gate
    results["builds"][key] = {p: str(b) if isinstance(b, Path) else f"did not build: {b}" for p, b in builds.items()}
    return builds


def bodies(prompts: list[str], shape: Shape, model: str | None, bias: dict[str, float]) -> list[dict[str, Any]]:
    """mbuild's bodies (model given), else llama.cpp's: the same plus cache_prompt false."""
    extra = {"model": model} if model else {"cache_prompt": False}
    return [{"prompt": text, "max_tokens": shape.new_tokens, "min_tokens": shape.new_tokens, "ignore_eos": True,
             "temperature": 0.0, "logit_bias": bias, "stream": True, "stream_options": {"include_usage": True},
             **extra} for text in prompts]


Case = tuple[str, Callable[[], float]]


def cases(shape: Shape, urls: dict[str, str], names: dict[str, str | None], prompts: list[str],
          bias: dict[str, float], runs: dict[str, list[dict[str, float]]]) -> list[Case]:
    """Each arm's runs at each concurrency; `names`: the model an arm's requests name (None: llama.cpp's body)."""
    found: list[Case] = []
    for concurrency in shape.concurrency:
        chosen = prompts[:shape.sequential if concurrency == 1 else concurrency]
        for arm, url in urls.items():
            payloads = bodies(chosen, shape, names.get(arm), bias)
            name = f"{shape.key} {arm} c={concurrency}"
            runs[name] = []
            found.append((name, partial(run, url, payloads, concurrency, len, runs[name], shape.run_seconds)))
    return found


def measure_pair(shape: Shape, pair: tuple[str, str], build: Path | str, gguf: Path | None, context: int,
                 texts: Texts, repeats: int, results: dict[str, Any]) -> None:
    """Both servers of a pair up on one server core, their cases interleaved; the checks on the way. An mbuild
    build that failed leaves llama.cpp measured alone; no GGUF (a quick run without llama.cpp), mbuild alone. A shape
    whose pair does not fit in RAM together (`apart`) serves one arm at a time, each arm's rounds in turn."""
    client_cpus, servers = split_cores()
    core = {min(servers)}
    ports = {"mbuild": free_port(), "llama": free_port()}
    base = {arm: f"http://{HOST}:{port}" for arm, port in ports.items()}
    prompts = [texts.text(PROMPT_TOKENS, seed) for seed in range(max(*shape.concurrency, shape.sequential))]
    starts: dict[str, Callable[[ExitStack], str]] = {}
    if isinstance(build, Path):
        ungated = pair[0] in results["ungated"].get(shape.key, {})
        command = mbuild_serve(build, ports["mbuild"]) + (["--allow-failed-gate"] if ungated else [])
        starts[f"mbuild {pair[0]}"] = lambda stack: _up(stack, command, READY, ports["mbuild"],
                                                        {"MBUILD_THREADS": "1"}, core)
    if gguf is not None:
        starts[f"llama.cpp {pair[1]}"] = lambda stack: _up(stack, llamacpp.serve(gguf, ports["llama"], context),
                                                           "/health", ports["llama"], None, core)
    else:
        base.pop("llama")
    groups = [[arm] for arm in starts] if shape.apart else [list(starts)]
    runs: dict[str, list[dict[str, float]]] = {}
    for group in groups:
        with ExitStack() as stack:
            urls = {arm: starts[arm](stack) for arm in group}
            names: dict[str, str | None] = {arm: served_name(ports["mbuild"]) for arm in group
                                            if arm.startswith("mbuild")}
            stack.enter_context(pinned(client_cpus))
            rounds(shape, urls, names, prompts, texts, repeats, runs)
            served = next((name for name in names.values() if name), "")
            if len(group) == len(starts) and served:  # the checks need every server of the pair up at once
                _checks(shape, pair, base, served, texts, prompts, results)
    results["runs"].update(runs)


def _up(stack: ExitStack, command: list[str], ready: str, port: int, env: dict[str, str] | None,
        core: set[int]) -> str:
    stack.enter_context(server(command, ready, port, env, cpus=core))
    return f"http://{HOST}:{port}/v1/completions"


def rounds(shape: Shape, urls: dict[str, str], names: dict[str, str | None], prompts: list[str], texts: Texts,
           repeats: int, runs: dict[str, list[dict[str, float]]]) -> None:
    """A warm-up wave for each arm (first-call costs), then the rounds, arms interleaved; every run's prompts were
    counted as the 64 tokens they are (each server's usage)."""
    found = cases(shape, urls, names, prompts, texts.silent(), runs)
    for name, warm in [case for case in found if case[0].endswith(f" c={shape.warm}")]:
        print(f"  warm-up {name}: {warm():.1f} tokens/s")
        runs[name].clear()
    interleave(found, min(repeats, shape.max_repeats))
    for name, _ in found:
        _check_prompt_tokens(name, runs[name])


def _check_prompt_tokens(name: str, runs: list[dict[str, float]]) -> None:
    """Both servers must see the same 64-token prompts, as their usage reports them."""
    for seen in (r[key] for r in runs for key in ("prompt_tokens_min", "prompt_tokens_max")):
        if seen != PROMPT_TOKENS:
            raise RuntimeError(f"{name}: the server counted {seen:.0f} prompt tokens, expected {PROMPT_TOKENS}")


def _checks(shape: Shape, pair: tuple[str, str], base: dict[str, str], served: str, texts: Texts,
            prompts: list[str], results: dict[str, Any]) -> None:
    if pair[0] == "fp32" and "llama" in base:
        ids = [texts.ids(text) for text in (prompts * 8)[:shape.greedy_prompts]]
        results["greedy"][shape.key] = greedy(base["mbuild"], base["llama"], served, texts, ids, shape.greedy_tokens)
        print(f"  greedy {shape.key}: {results['greedy'][shape.key]['equal']}/{len(ids)} prompts equal")
    if pair[0] == results["prefix_pair"].get(shape.key):
        mine = bodies([""], replace(shape, new_tokens=4), served, texts.silent())[0]
        theirs = {**bodies([""], replace(shape, new_tokens=4), None, texts.silent())[0], "cache_prompt": True}
        args = (texts, shape.prefix_tokens, shape.prefix_samples, PREFIX_SEED)
        results["prefix"][shape.key] = {"pair": list(pair),
                                        "mbuild": prefix_ttft(f"{base['mbuild']}/v1/completions", mine, *args)}
        if "llama" in base:
            results["prefix"][shape.key]["llama.cpp"] = prefix_ttft(f"{base['llama']}/v1/completions", theirs, *args)
        print(f"  shared prefix {shape.key}: " + ", ".join(
            f"{k} cached/uncached {v['ratio']:.2f}" for k, v in results["prefix"][shape.key].items() if k != "pair"))
