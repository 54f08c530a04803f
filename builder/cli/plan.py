"""`mbuild plan MODEL`: the frozen BuildPlan, printed; nothing downloaded (but config.json) or written."""

from __future__ import annotations

import json

import click

from builder.build.plan_package import PackageOptions, plan_package
from builder.cli.options import target_options
from builder.planning.plan import BuildPlan
from builder.progress import Reporter


def render_plan(plan: BuildPlan) -> str:
    model = plan.model
    pinned = model.sha or f"{model.revision} ({model.note})"
    facts = plan.facts
    lines = [
        f"plan {plan.digest()}",
        f"  image      {plan.tag}",
        f"  model      {model.repo} @ {pinned}",
        f"  task       {facts.task}, {facts.params:g}B parameters ({facts.source})",
        f"  target     {plan.target.describe()} [{plan.target.source}]",
        f"  profile    {plan.profile.name} ({plan.profile.id})",
        *[f"             - {line}" for line in plan.why],
        f"  base       {plan.base_image}",
        f"  runtime    {', '.join(plan.runtime_requirements)}",
        f"  tools      {', '.join(f'{k} {v}' for k, v in plan.tools)}",
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
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(model: str, gpu: str | None, profile: str | None, precision: str | None, mode: str | None, offline: bool,
         name: str | None, version: str | None, base_image: str | None, as_json: bool) -> None:
    """Print the build plan for MODEL without building anything."""
    opts = PackageOptions(model=model, gpu=gpu, offline=offline, profile=profile, precision=precision, mode=mode,
                          name=name, version=version, base_image=base_image)
    result = plan_package(opts, Reporter(quiet=True), for_plan_only=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        click.echo(render_plan(result), nl=False)
