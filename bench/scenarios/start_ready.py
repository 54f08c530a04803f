"""Start to ready: `mbuild serve` of the ~100M Llama (int8, fp32) from process start to its first 200 on ready.

Model: llm_peer's random ~100M Llama with the real Llama SPM tokenizer (bench/lib/llm_peer_shapes.py), built as
llm_peer builds it (`mbuild package --backend none --gpu cpu --precision P`; where the int8 gate fails on the random
weights, the engine as built, served with --allow-failed-gate). Each start: the command is started on one pinned
core, MBUILD_THREADS=1 (llama.cpp: --threads 1, llm_peer's flags), and this process, on another core, asks the ready
route (mbuild's /v1/health/ready, llama-server's /health) every 5 ms until it answers 200; the seconds from starting
the command to that answer are the start to ready. The server is then stopped (MBUILD_DRAIN_SECONDS=0) and the next
arm starts: the arms take turns, round after round, so a busy moment hits them alike.
Phases: mbuild's server logs when each phase of its start ended, counted from the start of `mbuild serve`'s process
(runtimes/startup.py); the page shows each phase's median seconds. The server process's imports are split by
package with `python -X importtime -c "import runtimes.server"` (which inflates them, so shares, not seconds, are the
point), and the engine phase into ONNX Runtime's session and the tokenizer, timed in this process.
`--before REF`: the same starts of a commit's mbuild (its own code and build, bench/lib/trees.py), side by side.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib import llamacpp, trees
from bench.lib.harness import OUT, Series, interleave, machine, work_folder, write
from bench.lib.llm_peer_shapes import QUICK, SHAPES, make_model
from bench.lib.mbuild import MBUILD, build_or_engine, context_of
from bench.lib.servers import HOST, free_port, pinned, split_cores
from bench.lib.start_phases import SPANS, imports_by_package, marks, median_spans, spans
from builder.serving.ready import Outcome, wait_ready
from runtimes.health import READY

# the one line of its page's header and of the README's index: bench/lib/page_header.py
MEASURES = "start to ready of `mbuild serve`, its phases, beside llama-server"

# What the numbers above do not show, measured by hand on this page's machine (2026-12-07, issue 61)
NOTES = (
    "Before 6abd096 the supervisor ran BentoML's `bentoml serve` (the row of `--before 38088a1`). Traced with strace "
    "(when each process began, when the port listened), a 3.5 s start went: `mbuild serve` 0.9 s (it imported all "
    "twelve commands' modules), the supervisor's checks 0.4 s (tokenizer.json parsed three times), BentoML's "
    "arbiter 1.2 s (it imports the whole app to read the service), its worker 1.4 s to listen (the app imported "
    "again), the engine's load and warm-up 0.3 s. Now the supervisor runs uvicorn on the app itself "
    "(runtimes/server.py); BentoML's server runs only where MBUILD_TRACING=1 asks for its spans.",
    "fp32's session is most of its engine phase: ONNX Runtime prepacks the fp32 MatMul weights into MLAS's blocked "
    "layout as it loads them (session.disable_prepacking: an 8 ms session, but a 64-token prefill 10-30% slower, "
    "measured), so it stays. int8's weights are read as they lie (ms).",
    "The floor left is Python's: FastAPI and pydantic, numpy and ONNX Runtime imported, and the routes' request "
    "schemas built, in the server process; llama.cpp's server is one C++ process that maps its GGUF.")
STARTS, QUICK_STARTS = 9, 1
PRECISIONS = (("int8", "q8_0"), ("fp32", "f32"))  # mbuild's, and the llama.cpp GGUF of the same bytes a weight
POLL_S, LIMIT_S = 0.005, 180.0
SERVER_ENV = {"MBUILD_THREADS": "1", "MBUILD_DRAIN_SECONDS": "0"}
# the command on a port, its environment, the folder it runs in, its ready route
Arm = tuple[Callable[[int], list[str]], dict[str, str], Path | None, str]


def parse_options(argv: list[str]) -> dict[str, Any]:
    """This scenario's own options, after `python -m bench start_ready`."""
    parser = argparse.ArgumentParser(prog="python -m bench start_ready")
    parser.add_argument("--starts", type=int, default=None, help=f"starts of each arm (default {STARTS}; quick "
                                                                 f"{QUICK_STARTS})")
    parser.add_argument("--before", metavar="REF", help="also start a commit's mbuild (int8), side by side")
    args = parser.parse_args(argv)
    if args.starts is not None and args.starts < 1:
        parser.error("--starts: at least 1")
    return {"starts": args.starts, "before": args.before}


def time_start(arm: Arm, cpus: set[int], logs: list[str]) -> float:
    """Seconds from starting the arm's command to its first 200 on the ready route; its log is kept in `logs`."""
    command, env, cwd, route = arm
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        began = time.perf_counter()
        proc = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **env}, start_new_session=True)
        os.sched_setaffinity(proc.pid, cpus)
        try:
            found = wait_ready(f"http://{HOST}:{port}", LIMIT_S, watch=[proc.poll], paths=(route,), every_s=POLL_S,
                               ask_s=1.0)
            seconds = time.perf_counter() - began
            if found.outcome is not Outcome.READY:
                log.seek(0)
                raise RuntimeError(f"{command(port)[:4]} never answered {route} ({found.outcome}): "
                                   f"{log.read()[-2000:]}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        logs.append(log.read())
    return seconds


def mbuild_arm(cli: list[str], bundle: Path, gate: str | None, env: dict[str, str], cwd: Path | None = None) -> Arm:
    allow = ["--allow-failed-gate"] if gate else []

    def command(port: int) -> list[str]:
        return [*cli, "serve", str(bundle), *allow, "--host", HOST, "--port", str(port)]

    return command, {**env, **SERVER_ENV}, cwd, READY


def engine_parts(bundle: Path) -> dict[str, float]:
    """The engine phase's two largest parts, timed in this process (the median of 3): ONNX Runtime's session (the
    custom kernels registered, the graph loaded) and the tokenizer (tokenizer.json parsed)."""
    from runtimes.bundle import load_engine_config
    from runtimes.engines import decoder_for
    from runtimes.tokenize import load_tokenizer

    model = bundle / "model"
    config = load_engine_config(model)
    parts: dict[str, list[float]] = {"ONNX Runtime session": [], "tokenizer": []}
    for _ in range(3):
        for name, load in (("ONNX Runtime session", lambda: decoder_for(model, config, 1)),
                           ("tokenizer", lambda: load_tokenizer(model / config.tokenizer_file))):
            began = time.perf_counter()
            load()
            parts[name].append(time.perf_counter() - began)
    return {name: statistics.median(seconds) for name, seconds in parts.items()}


def server_imports() -> dict[str, float]:
    """The server process's imports by package (`-X importtime`, this checkout's runtimes/server.py)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import runtimes.server"], capture_output=True,
                          text=True, check=True)
    return imports_by_package(done.stderr)


def _arms(work: Path, quick: bool, before: str | None, results: dict[str, Any]) -> dict[str, Arm]:
    shape = QUICK if quick else SHAPES[0]
    llamacpp.ensure_source()  # the Llama SPM vocabulary the model is made with
    model = make_model(shape, work)
    builds = {p: build_or_engine(model, work, p) for p, _ in PRECISIONS}
    results["builds"] = {p: str(b) if isinstance(b, Path) else f"did not build: {b}" for p, (b, _) in builds.items()}
    results["ungated"] = {p: gate for p, (_, gate) in builds.items() if gate}
    arms = {f"mbuild {p}": mbuild_arm(MBUILD, bundle, gate, {}) for p, (bundle, gate) in builds.items()
            if isinstance(bundle, Path)}
    results["engine_parts"] = {p: engine_parts(bundle) for p, (bundle, _) in builds.items() if isinstance(bundle, Path)}
    if before:
        tree, commit = trees.tree_at(before, work)
        built, gate = trees.build_or_engine(tree, model, work / f"before-{commit[:12]}", "int8")
        if isinstance(built, Path):
            command, env = trees.cli(tree)
            arms[f"mbuild int8 at {commit[:7]}"] = mbuild_arm(command, built, gate, env, tree)
        results["before"] = f"{before} ({commit[:7]})"
    if llamacpp.peer(quick):
        files = llamacpp.ggufs(llamacpp.spm_ready(model), work / "gguf", kinds=tuple(g for _, g in PRECISIONS))
        context = context_of({p: b for p, (b, _) in builds.items()}, model)
        for _, kind in PRECISIONS:
            arms[f"llama.cpp {kind}"] = partial(llamacpp.serve, files[kind], context=context), {}, None, "/health"
    return arms


def markdown(results: dict[str, Any], command: str) -> str:
    runs = results["runs"]
    lines = ["# Start to ready: `mbuild serve` against llama.cpp's server", "", (__doc__ or "").strip(), "",
             f"{results['starts']} starts of each arm; the servers on one pinned core.", "",
             "| arm | start to ready, median s | range s |", "| --- | ---: | ---: |"]
    lines += [f"| {arm} | {Series(s).median:.2f} | {Series(s).spread(2)} |" for arm, s in runs.items()]
    phased = {arm: median_spans(p) for arm, p in results["phases"].items() if any(p)}
    if phased:
        names = list(dict.fromkeys(name for found in phased.values() for name in found))
        lines += ["", "Where mbuild's start goes (medians over the starts, seconds):", "",
                  "| phase | " + " | ".join(phased) + " |", "| --- |" + " ---: |" * len(phased)]
        lines += [f"| {SPANS.get(name, name)} | " + " | ".join(f"{found.get(name, 0.0):.3f}" for found in
                                                             phased.values()) + " |" for name in names]
    lines += ["", *(line for note in NOTES for line in (note, ""))]
    lines += ["The engine phase's two largest parts, timed alone: " + "; ".join(
        f"{p}: " + ", ".join(f"{name} {s * 1000:.0f} ms" for name, s in parts.items())
        for p, parts in results["engine_parts"].items()) + ".", "",
        "The server process's imports by package (`-X importtime`, self times summed; it inflates them):", "",
        "| package | s | share |", "| --- | ---: | ---: |"]
    total = sum(results["imports"].values())
    lines += [f"| {name} | {s:.3f} | {100 * s / total:.0f}% |" for name, s in results["imports"].items()]
    if results["ungated"]:
        lines += ["", "Served with --allow-failed-gate (the gate on random weights): " + "; ".join(
            f"{p}: {why}" for p, why in results["ungated"].items()) + "."]
    lines += ["", f"Reproduce: `{command}` (writes docs/benchmarks/start_ready.json and .md; `--quick` starts the tiny "
              "Llama once into a scratch folder).", ""]
    return "\n".join(lines)


def main(repeats: int = 3, quick: bool = False, out: Path = OUT, work: Path | None = None,
         starts: int | None = None, before: str | None = None) -> Path:
    """`python -m bench start_ready [--starts N] [--before REF]`; `repeats` is not used: --starts sets the starts."""
    work = work or work_folder("start_ready", quick)
    work.mkdir(parents=True, exist_ok=True)
    starts = starts or (QUICK_STARTS if quick else STARTS)
    results: dict[str, Any] = {"machine": machine(), "starts": starts}
    arms = _arms(work, quick, before, results)
    client, servers = split_cores()
    core = {min(servers)}
    logs: dict[str, list[str]] = {arm: [] for arm in arms}
    cases: list[tuple[str, Callable[[], float]]] = [
        (name, partial(time_start, arm, core, logs[name])) for name, arm in arms.items()]
    with pinned(core):
        results["imports"] = server_imports()
    with pinned(client):
        series = interleave(cases, starts)
    results["runs"] = {name: s.values for name, s in series.items()}
    results["phases"] = {name: [spans(marks(log), total) for log, total in zip(logs[name], series[name].values,
                                                                                strict=True)] for name in arms}
    typed = f"python -m bench start_ready{' --quick' if quick else ''}" + (f" --before {before}" if before else "")
    text = markdown(results, typed)
    path = write("start_ready", results, text, out, measures=MEASURES)
    print(text)
    return path
