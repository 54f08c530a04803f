"""A sweep's result for a person and for a dashboard: the terminal table, bench.csv, and two PNG plots (the
frontier of tokens/s per replica against tokens/s per user; latency against load)."""

from __future__ import annotations

import csv
from pathlib import Path

from rich.table import Table

from builder.benchmark.result import BenchResult, Point, Slo, Spread, frontier, slo_point

CSV_FILE, FRONTIER_PNG, LATENCY_PNG = "bench.csv", "frontier.png", "latency.png"


def _ms(spread: Spread | None, percentile: int) -> str:
    return "-" if spread is None else f"{spread.at(percentile):.1f}"


def rows(result: BenchResult, slo: Slo | None) -> list[dict[str, str]]:
    """One row a point, the same columns for the table and the CSV; numbers as AIPerf reported them."""
    best = frontier(result.points)
    chosen = slo_point(result, slo) if slo else None
    found = []
    for p in result.points:
        cost = result.cost_per_million(p)
        joules = p.joules_per_token
        found.append({
            "concurrency": str(p.concurrency), "requests": str(p.requests), "errors": str(p.errors),
            "requests_per_s": f"{p.request_rate:.3f}", "tokens_per_s": f"{p.tokens_per_s:.1f}",
            "tokens_per_s_per_user": f"{p.per_user_tokens_per_s:.1f}",
            "ttft_p50_ms": _ms(p.ttft, 50), "ttft_p90_ms": _ms(p.ttft, 90), "ttft_p99_ms": _ms(p.ttft, 99),
            "tpot_p50_ms": _ms(p.tpot, 50), "tpot_p90_ms": _ms(p.tpot, 90), "tpot_p99_ms": _ms(p.tpot, 99),
            "itl_p50_ms": _ms(p.itl, 50), "itl_p90_ms": _ms(p.itl, 90), "itl_p99_ms": _ms(p.itl, 99),
            "latency_p50_ms": _ms(p.latency, 50), "latency_p90_ms": _ms(p.latency, 90),
            "latency_p99_ms": _ms(p.latency, 99),
            "usd_per_million_tokens": "-" if cost is None else f"{cost:.4f}",
            "joules_per_token": "-" if joules is None else f"{joules:.4f}",
            "frontier": "yes" if p in best else "no",
            "meets_slo": "-" if slo is None else "yes" if not slo.misses(p) and p.errors == 0 else "no",
            "slo_point": "yes" if chosen is p else "no",
        })
    return found


def table(result: BenchResult, slo: Slo | None) -> Table:
    unit = result.measured.unit
    shown = [("concurrency", "conc"), ("requests_per_s", "req/s"), ("tokens_per_s", f"{unit}/s"),
             ("tokens_per_s_per_user", "/s per user"), ("ttft_p50_ms", "TTFT p50"), ("ttft_p90_ms", "TTFT p90"),
             ("tpot_p50_ms", "TPOT p50"), ("tpot_p90_ms", "TPOT p90"), ("latency_p90_ms", "latency p90"),
             ("errors", "errors"), ("usd_per_million_tokens", "$/M tokens"), ("joules_per_token", "J/token")]
    m = result.measured
    lengths = f"{m.isl} in, {m.osl} out" if m.osl else f"{m.isl} in"
    title = f"{m.model} ({m.profile or m.kind}): {m.workload}, {lengths}, {m.tool}"
    view = Table(title=title, caption="ms unless named; * on the frontier; > the SLO point")
    for _, head in shown:
        view.add_column(head, justify="right")
    for row in rows(result, slo):
        mark = (">" if row["slo_point"] == "yes" else "") + ("*" if row["frontier"] == "yes" else "")
        view.add_row(*[row[key] + (mark if key == "concurrency" else "") for key, _ in shown])
    return view


def write_csv(result: BenchResult, slo: Slo | None, path: Path) -> Path:
    found = rows(result, slo)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(found[0]) if found else ["concurrency"])
        writer.writeheader()
        writer.writerows(found)
    return path


def _label(p: Point) -> str:
    return f"c={p.concurrency}"


def write_plots(result: BenchResult, frontier_png: Path, latency_png: Path) -> list[Path] | str:
    """The PNGs, or why there are none (matplotlib comes with AIPerf, so this is rare)."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plots: matplotlib is not installed (pip install matplotlib)"
    points = [p for p in result.points if p.requests > 0]
    unit = result.measured.unit
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([p.per_user_tokens_per_s for p in points], [p.tokens_per_s for p in points], "o:", color="0.6")
    best = frontier(result.points)
    ax.plot([p.per_user_tokens_per_s for p in best], [p.tokens_per_s for p in best], "o-", label="frontier")
    for p in points:
        ax.annotate(_label(p), (p.per_user_tokens_per_s, p.tokens_per_s), textcoords="offset points", xytext=(4, 4))
    ax.set(xlabel=f"{unit}/s per user", ylabel=f"{unit}/s per replica", title=result.measured.model)
    ax.legend()
    fig.tight_layout()
    fig.savefig(frontier_png, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    load = [p.concurrency for p in points]
    for name in ("ttft", "tpot", "latency"):
        spreads = [p.spread(name) for p in points]
        if all(s is not None for s in spreads):
            ax.plot(load, [s.p90 for s in spreads if s], "o-", label=f"{name} p90")
    ax.set(xlabel="concurrent requests", ylabel="ms", xscale="log", yscale="log", title="latency against load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(latency_png, dpi=110)
    plt.close(fig)
    return [frontier_png, latency_png]
