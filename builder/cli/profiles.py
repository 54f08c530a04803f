"""`mbuild profiles MODEL`: every profile, judged for this model on this target."""

from __future__ import annotations

import json

import click

from builder.build.plan_package import PackageOptions, planning_for
from builder.cli.options import target_options
from builder.cli.profiles_view import profiles_json, render_profiles


@click.command()
@click.argument("model")
@target_options
@click.option("--all", "every_row", is_flag=True, help="One row per incompatible profile, none summed up.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def profiles(model: str, gpu: str | None, profile: str | None, precision: str | None, mode: str | None,
             offline: bool, every_row: bool, as_json: bool) -> None:
    """List the profiles for MODEL: runnable, low on memory, incompatible (and why); mark the selected one."""
    opts = PackageOptions(model=model, gpu=gpu, offline=offline, profile=profile, precision=precision, mode=mode)
    found = planning_for(opts, for_plan_only=True)
    name = found.ref.repo
    if as_json:
        click.echo(json.dumps(profiles_json(name, found.facts, found.target, found.selection), indent=2))
    else:
        click.echo(render_profiles(name, found.facts, found.target, found.selection, every_row), nl=False)
