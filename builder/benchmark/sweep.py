"""A concurrency sweep: the target served, AIPerf at each concurrency, each point's energy where it can be read,
bench.json rewritten after every point (a failure later keeps what was measured), then the report."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from builder.benchmark import aiperf, energy
from builder.benchmark.result import RESULT_FILE, BenchResult, Measured, Point, Price, Unit
from builder.benchmark.target import Served, serving
from builder.benchmark.workloads import workload
from builder.errors import BenchFailed, InputError
from builder.resources import resource_dir

UNITS: dict[str, Unit] = {"chat": "output tokens", "completions": "output tokens", "embeddings": "input tokens"}


@dataclass(frozen=True)
class BenchOptions:
    target: str
    out: Path
    concurrency: tuple[int, ...]
    workload: str | None = None  # a preset; None: chat, or embed for an embedder
    isl: int | None = None
    osl: int | None = None
    prompts: Path | None = None
    requests: int | None = None  # per point; default 4 per concurrent stream, at least 16
    price_per_hour: float | None = None
    cores: int | None = None
    ready_s: float = 300
    point_timeout_s: float = 1800
    engine: str | None = None
    api_key: str | None = None
    tokenizer: str | None = None

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(16, 4 * concurrency)


def list_price(profile: str, cores: int | None) -> Price | None:
    """The profile's device's list price (profiles/prices.yaml) for this replica, where one is kept."""
    hardware = profile.split("-")[1] if profile.count("-") >= 1 else ""
    if not hardware.startswith("cpu") or not cores:
        return None
    entry = yaml.safe_load((resource_dir("profiles") / "prices.yaml").read_text())["prices"]["cpu"]
    return Price(per_hour=float(entry["per_core_hour"]) * cores,
                 source=f"{cores} core(s) x ${entry['per_core_hour']}/core-hour: {entry['source']}")


OURS = {RESULT_FILE, "bench.csv", "frontier.png", "latency.png", "server.log", "prompts.jsonl", "aiperf", "tokenizer"}


def claim_output(out: Path) -> None:
    """A new or empty folder, or an earlier bench's (whose files are replaced): never a folder of the user's."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--output {out} is a file", hint="give a folder for the results")
    found = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if found and RESULT_FILE not in found and not found <= OURS:
        raise InputError(f"--output {out} holds files `mbuild bench` did not write ({', '.join(sorted(found)[:3])})",
                         hint="give a new folder, or an earlier bench's")
    for name in found & OURS:
        target = out / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _endpoint(served: Served) -> str:
    """Chat where the model has a chat template (what applications call), else prompts; embeddings."""
    endpoint = {"text-generation": "chat" if served.chat else "completions", "embedding": "embeddings"}.get(served.task)
    if endpoint is None:
        raise InputError(f"{served.target} serves a {served.task} model; `mbuild bench` measures language models "
                         "and embedders", hint="bench a language model or an embedder build")
    return endpoint


def run_sweep(opts: BenchOptions, progress: Callable[[int, int, Point | None], None],
              warn: Callable[[str], None] = print) -> BenchResult:
    """Every point, in order; bench.json in opts.out after each. BenchFailed after writing what was measured."""
    claim_output(opts.out)
    # every length and prompt checked before anything is served; an embedder's default preset once it says so
    load = workload(opts.workload or "chat", opts.isl, opts.osl, opts.prompts, opts.out)
    with serving(opts.target, opts.out, cores=opts.cores, ready_s=opts.ready_s, engine=opts.engine,
                 api_key=opts.api_key, tokenizer=opts.tokenizer) as served:
        if opts.tokenizer:
            served = dataclasses.replace(served, tokenizer=opts.tokenizer)
        endpoint = _endpoint(served)
        if served.gate:
            warn(f"warning: {served.target} failed its numerical gate ({served.gate}); its speed is measured, "
                 "but `mbuild serve` refuses to serve it")
        generates = endpoint != "embeddings"
        if opts.workload is None and not generates:
            load = workload("embed", opts.isl, opts.osl, opts.prompts, opts.out)
        meter = energy.meter(served.local)
        price = (Price(opts.price_per_hour, "--price-per-hour") if opts.price_per_hour is not None
                 else list_price(served.profile, served.cores))
        measured = Measured(kind=served.kind, target=served.target, model=served.model, task=served.task,
                            profile_id=served.profile_id, profile=served.profile, cores=served.cores,
                            workload=load.name, endpoint=endpoint, isl=load.isl, osl=load.osl if generates else 0,
                            unit=UNITS[endpoint], tool=f"aiperf {aiperf.VERSION}")
        call = aiperf.Call(served.url, served.model, endpoint, served.tokenizer, load, opts.api_key,
                          served.client_cores)
        points: list[Point] = []
        result = BenchResult(measured, (), price, meter.how)
        for n, concurrency in enumerate(opts.concurrency):
            progress(n, len(opts.concurrency), None)
            folder = opts.out / "aiperf" / f"c{concurrency}"
            try:
                point, joules = meter.measure(functools.partial(
                    aiperf.run_point, call, concurrency, opts.requests_at(concurrency), folder, opts.point_timeout_s))
            except BenchFailed as exc:
                kept = f"{len(points)} point(s) measured before it are in {opts.out / RESULT_FILE}" if points else \
                    "no point was measured"
                raise BenchFailed(f"{exc.message}\n{kept}", hint=exc.hint) from exc
            points.append(dataclasses.replace(point, energy_j=joules))
            result = dataclasses.replace(result, points=tuple(points))
            (opts.out / RESULT_FILE).write_text(result.to_json())
            progress(n + 1, len(opts.concurrency), points[-1])
    return result
