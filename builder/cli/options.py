"""Options shared by package, plan and profiles, declared once."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from builder.planning.precisions import PRECISIONS
from builder.versions import EXTRAS

F = Callable[..., Any]


class FiniteRange(click.FloatRange):
    """A FloatRange that refuses nan too (click's lets it through: nan compares false with both bounds)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number (give one from {self.min} to {self.max}).", param, ctx)
        return number


def target_options(func: F) -> F:
    """--gpu, --profile, --precision, --mode, --offline."""
    for option in reversed([
        click.option("--gpu", default=None, metavar="cpu|NAME[xN]",
                     help="Target hardware: cpu, or a GPU such as h100, l4x2 (default: this host's, detected)."),
        click.option("--profile", "profile", default=None, metavar="ID|NAME",
                     help="Use this profile (also MBUILD_PROFILE); see `mbuild profiles MODEL`."),
        click.option("--precision", type=click.Choice(list(PRECISIONS)),
                     help="Only profiles of this precision."),
        click.option("--mode", type=click.Choice(["latency", "throughput"]), help="Only profiles of this mode."),
        click.option("--offline", is_flag=True, help="Use only the local Hugging Face cache (also HF_HUB_OFFLINE=1)."),
    ]):
        func = option(func)
    return func


def draft_option(func: F) -> F:
    """--draft MODEL (package and plan)."""
    return click.option(
        "--draft", metavar="MODEL", help="A smaller model with the target's tokenizer, built beside it as the "
        "speculative-decoding draft (same profile, gated like the target, its memory in the plan); the server "
        "drafts with it unless MBUILD_SPECULATIVE says otherwise.")(func)


def model_impl_option(func: F) -> F:
    """--model-impl (package and plan): which export builds a language model."""
    return click.option(
        "--model-impl", type=click.Choice(["auto", "fast-lane", "generic"]), default="auto", show_default=True,
        help="A language model's export: fast-lane (the graph mbuild writes by hand for its families), generic "
        "(traced from transformers' own modeling code, any causal LM) or auto (the fast lane where a family has "
        "one). CPU builds; `mbuild plan` says which path a model takes.")(func)


def extras_option(func: F) -> F:
    """--with NAME (package and plan), repeatable."""
    return click.option(
        "--with", "extras", multiple=True, type=click.Choice(sorted(EXTRAS)),
        help="Put an optional part into the image: dynamo runs it as an NVIDIA Dynamo worker "
        "(`python3 -m runtimes.dynamo`) and frontend, for `mbuild deploy --format dynamo` (about 250 MB; language "
        "models).")(func)


def sizing_options(func: F) -> F:
    """--bench, --tokens-per-day, --slo, --slo-percentile, --peak-factor (plan and deploy): replicas from a sweep."""
    for option in reversed([
        click.option("--bench", "bench_result", type=click.Path(path_type=Path),
                     help="A bench.json (or its folder) from `mbuild bench`: size replicas from what it measured."),
        click.option("--tokens-per-day", type=click.IntRange(1, 10**15),
                     help="With --bench and --slo: the day's volume (output tokens; input tokens for embedders)."),
        click.option("--slo", help="With --bench: latency bounds a replica must keep, e.g. ttft=500ms,tpot=50ms."),
        click.option("--slo-percentile", type=click.Choice(["50", "90", "99"]), default="90", show_default=True),
        click.option("--peak-factor", type=FiniteRange(1, 100), default=2.0, show_default=True,
                     help="The busiest hour's rate over the day's mean: the autoscaler's ceiling."),
    ]):
        func = option(func)
    return func
