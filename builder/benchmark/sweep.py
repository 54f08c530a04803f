"""A concurrency sweep: the target served, AIPerf at each concurrency, each point's energy where it can be read,
bench.json rewritten after every point (a failure later keeps what was measured), then the report."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from builder.benchmark import aiperf, energy
from builder.benchmark.output import AIPERF, PROMPTS, Output
from builder.benchmark.result import RESULT_FILE, BenchResult, Measured, Point, Price, Unit
from builder.benchmark.target import Served, build_engine, image_engine, serving, split_cores
from builder.benchmark.workloads import Workload, check_fits, workload
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


def _check_url(target: str) -> None:
    """A URL httpx and AIPerf can both take: no whitespace or control character, a host."""
    hint = "give the server's base URL, e.g. http://127.0.0.1:8000"
    if any(c.isspace() or not c.isprintable() for c in target):
        raise InputError(f"the target URL {target!a} holds whitespace or a control character", hint=hint)
    try:
        host = httpx.URL(target).host
    except httpx.InvalidURL as exc:
        raise InputError(f"the target URL {target!a} is not a URL ({exc})", hint=hint) from exc
    if not host:
        raise InputError(f"the target URL {target!a} names no host", hint=hint)


def _for_task(opts: BenchOptions, load: Workload, generates: bool) -> Workload:
    """An embedder's default preset is embed, once the target says it is one."""
    if opts.workload is None and opts.prompts is None and not generates:
        return workload("embed", opts.isl, opts.osl, None)
    return load


def prepare(opts: BenchOptions) -> Workload:
    """Every option checked before anything is written or served: the lengths and prompts, the cores, the
    tokenizer's place, the target (a URL's form, an image's engine, a build's task and context against the
    workload)."""
    load = workload(opts.workload or "chat", opts.isl, opts.osl, opts.prompts)
    split_cores(opts.cores)
    if opts.tokenizer and Path(opts.tokenizer).exists() and \
            Path(opts.tokenizer).resolve().is_relative_to(opts.out.resolve()):
        raise InputError(f"--tokenizer {opts.tokenizer} lies inside --output {opts.out}, whose earlier results "
                         "this run replaces", hint="copy the tokenizer elsewhere, or give another --output")
    if opts.target.startswith(("http://", "https://")):
        _check_url(opts.target)
    elif Path(opts.target).is_dir():
        engine = build_engine(Path(opts.target))
        generates = _endpoint_of(engine.task, opts.target) != "embeddings"
        load = _for_task(opts, load, generates)
        check_fits(load, generates, engine.max_seq_length, opts.target)
    else:
        image_engine(opts.target, opts.engine)
    return load


_ENDPOINTS = {"text-generation": "chat", "embedding": "embeddings"}


def _endpoint_of(task: str, target: str) -> str:
    if task not in _ENDPOINTS:
        raise InputError(f"{target} serves a {task} model; `mbuild bench` measures language models and embedders",
                         hint="bench a language model or an embedder build")
    return _ENDPOINTS[task]


def _endpoint(served: Served) -> str:
    """Chat where the model has a chat template (what applications call), else prompts; embeddings."""
    endpoint = _endpoint_of(served.task, served.target)
    return "completions" if endpoint == "chat" and not served.chat else endpoint


def run_sweep(opts: BenchOptions, load: Workload, out: Output, progress: Callable[[int, int, Point | None], None],
              warn: Callable[[str], None] = print) -> BenchResult:
    """Every point, in order; bench.json in out after each. BenchFailed after writing what was measured.
    load is prepare's; out, claim_output's."""
    with serving(opts.target, out, cores=opts.cores, ready_s=opts.ready_s, engine=opts.engine,
                 api_key=opts.api_key, tokenizer=opts.tokenizer) as served:
        if opts.tokenizer:
            served = dataclasses.replace(served, tokenizer=opts.tokenizer)
        endpoint = _endpoint(served)
        if served.gate:
            warn(f"warning: {served.target} failed its numerical gate ({served.gate}); its speed is measured, "
                 "but `mbuild serve` refuses to serve it")
        generates = endpoint != "embeddings"
        load = _for_task(opts, load, generates)
        if served.context is not None:  # an image's or a URL's, as its /v1/metadata says
            check_fits(load, generates, served.context, served.target)
        if load.dataset:
            prompts = out.path(PROMPTS)
            prompts.write_text(load.dataset)
            load = dataclasses.replace(load, prompts=prompts)
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
            folder = out.path(AIPERF) / f"c{concurrency}"
            try:
                point, joules = meter.measure(functools.partial(
                    aiperf.run_point, call, concurrency, opts.requests_at(concurrency), folder, opts.point_timeout_s))
            except BenchFailed as exc:
                kept = f"{len(points)} point(s) measured before it are in {out.path(RESULT_FILE)}" if points else \
                    "no point was measured"
                raise BenchFailed(f"{exc.message}\n{kept}", hint=exc.hint) from exc
            points.append(dataclasses.replace(point, energy_j=joules))
            result = dataclasses.replace(result, points=tuple(points))
            out.path(RESULT_FILE).write_text(result.to_json())
            progress(n + 1, len(opts.concurrency), points[-1])
    return result
