"""`mbuild plan MODEL`: the frozen BuildPlan, printed; nothing downloaded (but config.json) or written."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from builder.benchmark.sizing import Sizing, sizing_from_options
from builder.build.plan_package import PackageOptions, plan_package
from builder.cli.options import draft_option, extras_option, model_impl_option, sizing_options, target_options
from builder.model.catalog import ModelFacts
from builder.model.shape import billions
from builder.planning.memory import kv_bytes_per_token, kv_bytes_per_value, served_context
from builder.planning.plan import BuildPlan
from builder.progress import Reporter
from runtimes.bundle.engine import KV_BLOCK_TOKENS


def _shape(facts: ModelFacts) -> str:
    attention = f"{facts.layers} layers, {facts.heads} heads, {facts.kv_heads} KV heads of {facts.head_dim}"
    experts = (f"; {facts.experts} experts of {facts.expert_intermediate} in {len(facts.moe_layers)} layers, "
               f"{facts.experts_per_token} a token" if facts.experts else "")
    head = " (no LM head: an embedder)" if facts.task != "text-generation" else " (tied head)" if facts.tied else ""
    return f"{facts.family}: {attention}{experts}, vocab {facts.vocab}{head}"


def _layer_caches(facts: ModelFacts) -> str:
    """'28 layers x 8 KV heads x 128', or per shape where the layers' caches differ."""
    shapes = Counter(facts.layer_caches or [(facts.kv_heads, facts.head_dim)] * facts.layers)
    parts = [f"{count} layers x {heads} KV heads x {dim}" for (heads, dim), count in shapes.items()]
    return parts[0] if len(parts) == 1 else f"({' + '.join(parts)})"


def memory_lines(plan: BuildPlan) -> list[str]:
    """The plan's memory, each number with what it is made of, to check by hand (docs/usage.md)."""
    facts, need, profile = plan.facts, plan.need, plan.profile
    where = "per GPU" if profile.device == "gpu" else "of RAM"
    served = f"weights {need.weights_gb:.2f} + KV cache {need.kv_cache_gb:.2f}"
    served = f"({served}) / tp{profile.tp}" if profile.tp > 1 else served
    lines = [f"{need.rounded_gb:g} GB {where}: {served} + headroom {need.overhead_gb:.2f} = "
             f"{need.per_device_gb:.2f}, rounded up"]
    if facts.task == "text-generation":
        every = ", every expert's" if facts.experts else ""
        routed = f"{facts.experts_per_token} of {facts.experts} experts a layer; " if facts.experts else ""
        table = "the tied token table read whole, as the LM head" if facts.tied else "of the token table, a row"
        lines.append(f"weights: {facts.describe_params()} at {profile.precision}{every}; a decode step reads "
                     f"{need.decode_read_gb:.2f} GB of them: {billions(facts.decode_params)} parameters "
                     f"({routed}{table})")
        per_value = kv_bytes_per_value(profile)
        lines.append(f"KV cache: {kv_bytes_per_token(facts, profile):.0f} B a token ({facts.kv_kinds} x "
                     f"{_layer_caches(facts)} x "
                     f"{per_value:g} B) x {served_context(facts, profile)} tokens x {profile.limits.max_batch} "
                     "sequences")
        if profile.device == "cpu":
            lines.append(f"  one pool of {need.kv_tokens:,.0f} tokens in {KV_BLOCK_TOKENS}-token blocks, shared by "
                         "the sequences and the prefix cache; its pages are committed as sequences fill them, so "
                         f"a ready server holds {need.start_gb:.2f} GB (the weights and the serving processes); "
                         "MBUILD_KV_CACHE_MB sets a smaller pool")
        if need.kv_window_gb < need.kv_cache_gb:
            lines.append(f"  {facts.sliding_layers} of {facts.layers} layers attend to {facts.sliding_window} "
                         "tokens, but the runtime caches the whole context for every layer; caching the window "
                         f"would take {need.kv_window_gb:.2f} GB (not done yet)")
    if plan.draft is not None:
        alone = plan.draft.need
        lines.append(f"with the draft model: its weights {alone.weights_gb:.2f} + its KV cache {alone.kv_cache_gb:.2f} "
                     f"({kv_bytes_per_token(plan.draft.facts, profile):.0f} B a token x "
                     f"{served_context(plan.draft.facts, profile)} tokens x {profile.limits.max_batch} sequences), "
                     "in the sums above")
    lines.append(f"download {facts.download_gb:.2f} GB (the checkpoint); build {need.build_gb:.1f} GB of RAM and "
                 f"{need.build_disk_gb:.1f} GB of disk")
    return lines


def render_plan(plan: BuildPlan) -> str:
    model = plan.model
    pinned = model.sha or f"{model.revision} ({model.note})"
    facts = plan.facts
    memory = memory_lines(plan)
    lines = [
        f"plan {plan.digest()}",
        f"  image      {plan.tag}",
        f"  model      {model.repo} @ {pinned}",
        f"  task       {facts.task}, {facts.describe_params()} ({facts.source})",
        *([f"  family     {_shape(facts)}"] if facts.family else []),
        *([f"  path       {plan.export_path}"] if plan.export_path else []),
        *([f"  draft      {plan.draft.model.repo} @ {plan.draft.model.sha or plan.draft.model.revision}: "
           f"{_shape(plan.draft.facts)}"] if plan.draft else []),
        f"  target     {plan.target.describe()} [{plan.target.source}]",
        f"  profile    {plan.profile.name} ({plan.profile.id})",
        *[f"             - {line}" for line in plan.why],
        f"  base       {plan.base_image}",
        f"  runtime    {', '.join(plan.runtime_requirements)}",
        *([f"  with       {', '.join(plan.extras)} (then without dependencies: {', '.join(plan.runtime_no_deps)})"]
          if plan.extras else []),
        f"  tools      {', '.join(f'{k} {v}' for k, v in plan.tools)}",
        f"  memory     {memory[0]}",
        *[f"             {line}" for line in memory[1:]],
        f"  requires   {json.dumps(plan.requires().to_dict(), sort_keys=True)}",
    ]
    if model.files:
        lines.append(f"  files      {', '.join(model.files)}")
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("model")
@target_options
@click.option("--name", help="Image repository name (default: mbuild/<model>).")
@click.option("--version", "version", help="Image version (default: sha-<plan digest>).")
@click.option("--base-image", help="Base image (default: the profile's).")
@draft_option
@extras_option
@model_impl_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (sizing lines go to stderr).")
@sizing_options
def plan(model: str, gpu: str | None, profile: str | None, precision: str | None, mode: str | None, offline: bool,
         name: str | None, version: str | None, base_image: str | None, draft: str | None, extras: tuple[str, ...],
         model_impl: str, as_json: bool, bench_result: Path | None, tokens_per_day: int | None, slo: str | None,
         slo_percentile: str, peak_factor: float) -> None:
    """Print the build plan for MODEL without building anything."""
    opts = PackageOptions(model=model, gpu=gpu, offline=offline, profile=profile, precision=precision, mode=mode,
                          name=name, version=version, base_image=base_image, draft=draft,
                          extras=tuple(dict.fromkeys(extras)), model_impl=model_impl)
    result = plan_package(opts, Reporter(quiet=True), for_plan_only=True)
    sizing = sizing_from_options(bench_result, tokens_per_day, slo, int(slo_percentile), peak_factor,
                                 result.profile.id)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        for line in sizing_lines(sizing):
            click.echo(line, err=True)
    else:
        click.echo(render_plan(result) + "".join(f"{line}\n" for line in sizing_lines(sizing)), nl=False)


def sizing_lines(sizing: Sizing | None) -> list[str]:
    if sizing is None:
        return []
    head = f"  replicas   {sizing.min_replicas} to {sizing.max_replicas} (the autoscaler's min and max)"
    return [head, *[f"             {line}" for line in sizing.lines()]]
