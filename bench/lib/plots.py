"""PNG plots for docs/benchmarks/, written with matplotlib's file-only backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here: files only
import matplotlib.pyplot as plt  # after the backend is chosen
from matplotlib.ticker import FuncFormatter


def save_embedding_plot(data: dict[str, Any], path: Path) -> Path:
    """Sequences/s and p50 against concurrency, one line per arm."""
    rows = data["rows"].values()
    arms = list(dict.fromkeys(row["arm"] for row in rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in arms:
        mine = sorted((row for row in rows if row["arm"] == arm), key=lambda row: row["concurrency"])
        levels = [row["concurrency"] for row in mine]
        left.plot(levels, [row["rate_median"] for row in mine], marker="o", label=arm)
        right.plot(levels, [row["p50_ms"] for row in mine], marker="o", label=arm)
    for axis, label in ((left, "sequences/s (higher is better)"), (right, "p50 latency, ms (lower is better)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks([1, 4, 16], ["1", "4", "16"])
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    right.set_yscale("log")
    left.legend()
    figure.suptitle("all-MiniLM-L6-v2 served, one sentence a request")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def save_llm_plot(points: dict[str, list[tuple[int, float, float]]], title: str, path: Path) -> Path:
    """Throughput against interactivity: one line per arm, a point per (concurrency, total, per user)."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for arm, rows in points.items():
        axis.plot([row[1] for row in rows], [row[2] for row in rows], marker="o", label=arm)
        for index, (concurrency, x, y) in enumerate(rows):
            # labels stepped downwards: a lock-bound server puts several concurrencies on one point
            axis.annotate(f"c={concurrency}", (x, y), textcoords="offset points", xytext=(6, 6 - 11 * index),
                          fontsize=8)
    axis.set_xlim(left=0)
    _label(axis, title, "total output tokens/s", "output tokens/s per user (1 / TPOT p50)", 10)
    return _save(figure, path, 120)


def _label(axis: Any, title: str, xlabel: str, ylabel: str, legend_size: int) -> None:
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_size)


def _save(figure: Any, path: Path, dpi: int) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


def save_peer_plot(panels: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> Path:
    """Total output tokens/s against concurrency, a panel per model; arms named "<server> <precision>", a colour
    per precision pair (the i-th mbuild arm with the i-th llama.cpp arm), mbuild solid, llama.cpp dashed."""
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for axis, (title, arms) in zip(axes[0], panels.items(), strict=True):
        colours: dict[str, int] = {}
        for arm, rows in arms.items():
            server = arm.split()[0]
            colour = f"C{colours.setdefault(server, 0)}"
            colours[server] += 1
            axis.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", color=colour,
                      linestyle="-" if server == "mbuild" else "--", label=arm)
        levels = sorted({r[0] for rows in arms.values() for r in rows})
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(c) for c in levels])
        _label(axis, title, "concurrent requests", "total output tokens/s (higher is better)", 8)
    return _save(figure, path, 110)


def save_scale_plot(lines: dict[str, list[tuple[float, float]]], title: str, path: Path) -> Path:
    """Peak build memory against parameter count (both log): one line per arm, a point per model shape; arms named
    "<tool> <precision>", mbuild solid, llama.cpp dashed, a reference arm (fp32 weights) dotted grey."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for arm, points in lines.items():
        points = sorted(points)
        style: dict[str, Any] = ({"color": "grey", "linestyle": ":", "marker": "x"}
                                 if not arm.startswith(("mbuild", "llama.cpp"))
                                 else {"linestyle": "-" if arm.startswith("mbuild") else "--", "marker": "o"})
        axis.plot([p[0] for p in points], [p[1] for p in points], label=arm, **style)
    axis.set_xscale("log")
    _label(axis, title, "parameters", "peak RSS of the process tree, GiB", 8)
    axis.set_yscale("log")  # 0.4 GiB to tens: after _label, whose linear floor of 0 a log axis cannot take
    axis.autoscale(axis="y")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    axis.yaxis.set_major_formatter(plain)
    axis.yaxis.set_minor_formatter(plain)
    return _save(figure, path, 110)


def save_speedup_plot(points: list[tuple[str, int, str, float | None, float]], path: Path) -> Path:
    """Speculation's speedup (on / off tokens/s) against its measured acceptance: a point per (server, concurrency,
    prompt kind), mbuild circles, llama.cpp squares, a colour per concurrency; hollow at 0 where nothing was
    drafted; the break-even line at 1."""
    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    levels = sorted({point[1] for point in points})
    for server, concurrency, kind, acceptance, speedup in points:
        colour = f"C{levels.index(concurrency)}"
        axis.scatter([acceptance or 0.0], [speedup], marker="o" if server == "mbuild" else "s", s=36,
                     facecolors=colour if acceptance is not None else "none", edgecolors=colour)
        axis.annotate(kind, (acceptance or 0.0, speedup), textcoords="offset points", xytext=(5, 3), fontsize=7)
    axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    for server, marker in (("mbuild", "o"), ("llama.cpp", "s")):
        axis.scatter([], [], marker=marker, color="grey", label=server)
    for index, concurrency in enumerate(levels):
        axis.scatter([], [], marker="o", color=f"C{index}", label=f"c={concurrency}")
    axis.scatter([], [], marker="o", facecolors="none", edgecolors="grey", label="nothing drafted (at 0)")
    axis.set_xlim(-0.05, 1.05)
    _label(axis, "speculation on / off, output tokens/s, against acceptance", "acceptance (accepted / drafted)",
           "speedup (on / off tokens/s)", 8)
    return _save(figure, path, 110)
