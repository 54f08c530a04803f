"""`mbuild bench TARGET`: a concurrency sweep through AIPerf; the table, bench.json/csv and plots in --output."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from builder.benchmark.output import claim_output
from builder.benchmark.report import CSV_FILE, FRONTIER_PNG, LATENCY_PNG, table, write_csv, write_plots
from builder.benchmark.result import PERCENTILES, RESULT_FILE, Point, parse_slo, slo_point
from builder.benchmark.sweep import BenchOptions, prepare, run_sweep
from builder.benchmark.workloads import PRESETS
from builder.cli.options import FiniteRange
from builder.errors import InputError, SloUnmet

MAX_POINTS = 16


def _concurrency(text: str) -> tuple[int, ...]:
    hint = "give a comma-separated list such as 1,4,16"
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise InputError(f"--concurrency {text!r} is not a list of whole numbers", hint=hint) from exc
    if not values or len(values) > MAX_POINTS or any(not 1 <= v <= 4096 for v in values):
        raise InputError(f"--concurrency {text!r}: 1 to {MAX_POINTS} values, each in 1..4096", hint=hint)
    if len(set(values)) != len(values):
        raise InputError(f"--concurrency {text!r} names a point twice", hint=hint)
    return tuple(sorted(values))


@click.command()
@click.argument("target")
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False), default=Path("bench-out"),
              show_default=True, help="Folder for bench.json, bench.csv, the plots and AIPerf's raw results: a "
              "new or empty one, or an earlier bench's (only what that run wrote is replaced).")
@click.option("--workload", type=click.Choice(sorted(PRESETS)), default=None,
              help="chat 1k/1k, reasoning 1k/8k, summarization 8k/1k (InferenceMAX's), rag (a shared 4k "
                   "document), embed (256-token passages). Default: chat, or embed for an embedder.")
@click.option("--prompts", type=click.Path(path_type=Path, dir_okay=False),
              help='Your own prompts instead: JSONL, {"text": ..., "output_length": N} a line.')
@click.option("--isl", type=int, help="Input tokens a request (overrides the preset).")
@click.option("--osl", type=int, help="Output tokens a request (overrides the preset).")
@click.option("--concurrency", default="1,4,16", show_default=True, help="The sweep: concurrent requests a point.")
@click.option("--requests", type=click.IntRange(1, 100_000), help="Requests a point (default 4 per stream, >= 16).")
@click.option("--slo", help="Latency bounds, e.g. ttft=500ms,tpot=50ms (ttft, tpot, itl, latency): the table "
                            "marks the highest load meeting them; none meeting is exit 17.")
@click.option("--slo-percentile", type=click.Choice([str(p) for p in PERCENTILES]), default="90", show_default=True)
@click.option("--price-per-hour", type=FiniteRange(0, 1e6), help="US$ an hour for one replica (default: "
              "the profile's device's list price in profiles/prices.yaml, times its cores, where one is kept).")
@click.option("--cores", type=click.IntRange(1, 4096), help="Cores to give a build or image (default: all of "
              "this process's); a URL's, for its price.")
@click.option("--engine", type=click.Choice(["docker", "podman"]), help="Which runs an image (default: the one "
                                                                          "holding it).")
@click.option("--api-key", help="A URL's key (it reaches AIPerf on its command line).")
@click.option("--tokenizer", help="A folder with the model's tokenizer.json (default: the build's or image's; for "
                                  "a URL, AIPerf's builtin).")
@click.option("--ready-timeout", type=FiniteRange(1, 3600), default=300, show_default=True,
              help="Seconds a build or image may take to become ready.")
def bench(target: str, output: Path, workload: str | None, prompts: Path | None, isl: int | None, osl: int | None,
          concurrency: str, requests: int | None, slo: str | None, slo_percentile: str, price_per_hour: float | None,
          cores: int | None, engine: str | None, api_key: str | None, tokenizer: str | None,
          ready_timeout: float) -> None:
    """Measure TARGET (a build directory, an image or an http(s) URL) over a concurrency sweep with AIPerf.

    Writes OUTPUT/bench.json (what `mbuild plan/deploy --bench` size replicas from), bench.csv, frontier.png and
    latency.png, and keeps AIPerf's own reports under OUTPUT/aiperf/.
    """
    objective = parse_slo(slo, int(slo_percentile)) if slo else None  # a bad --slo stops before any work
    if prompts is not None and workload is not None:
        raise InputError("--prompts and --workload both say what to send", hint="give one of them")
    opts = BenchOptions(target=target, out=output, concurrency=_concurrency(concurrency),
                        workload=workload, isl=isl, osl=osl,
                        prompts=prompts, requests=requests, price_per_hour=price_per_hour, cores=cores,
                        ready_s=ready_timeout, engine=engine, api_key=api_key, tokenizer=tokenizer)
    load = prepare(opts)  # every option checked: nothing is written or served before
    out = claim_output(output)  # a folder of the user's is refused; an earlier bench's results are replaced
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task("starting the target", total=len(opts.concurrency))

        def moved(done: int, total: int, point: Point | None) -> None:
            ahead = opts.concurrency[done] if done < total else None
            bar.update(task, completed=done, description=f"concurrency {ahead}" if ahead else "done")
            if point is not None:
                bar.console.print(f"  c={point.concurrency}: {point.tokens_per_s:.1f} tokens/s, "
                                  f"{point.requests} requests, {point.errors} errors")
        result = run_sweep(opts, load, out, moved, lambda line: bar.console.print(line, style="yellow"))
    wide = None if sys.stdout.isatty() else 200  # logs and CI: one line a row
    Console(highlight=False, width=wide).print(table(result, objective))
    write_csv(result, objective, out.path(CSV_FILE))
    plots = write_plots(result, out.path(FRONTIER_PNG), out.path(LATENCY_PNG))
    click.echo(f"energy: {result.energy}", err=True)
    if result.price is None:
        click.echo("cost: no price kept for this device; give --price-per-hour", err=True)
    click.echo(f"wrote {output / RESULT_FILE}, bench.csv" +
               (", " + ", ".join(p.name for p in plots) if isinstance(plots, list) else f"; {plots}"), err=True)
    if objective is not None:
        chosen = slo_point(result, objective)
        if chosen is None:
            raise SloUnmet(f"no point meets {objective.describe()}; everything measured is in {output}",
                           hint="bench lower concurrencies, loosen --slo, or pick a faster profile")
        click.echo(f"SLO ({objective.describe()}): concurrency {chosen.concurrency}, {chosen.tokens_per_s:.1f} "
                   f"{result.measured.unit}/s a replica", err=True)

