"""`mbuild push`, `mbuild load` and `mbuild inspect`: the image side of a build, for DevOps."""

from __future__ import annotations

import json

import click

from builder.engine.report import verdict
from builder.image.inspect import inspect_target
from builder.image.load import load as load_image
from builder.image.push import push as push_image
from runtimes.settings import PORT


@click.command()
@click.argument("source")
@click.argument("destination")
@click.option("--format", "fmt", type=click.Choice(["v2s2", "oci"]), default="v2s2", show_default=True,
              help="Manifest type when pushing from docker or podman (an OCI layout keeps its own).")
def push(source: str, destination: str, fmt: str) -> None:
    """Push SOURCE to DESTINATION (registry/repo[:tag]).

    SOURCE: a build dir, oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE, or a local image.
    """
    result = push_image(source, destination, fmt)
    click.echo(f"pushed {result.destination} with {result.tool}")
    click.echo(f"digest {result.digest}" + (" (same as the local image)" if result.local_digest else ""))


@click.command()
@click.argument("source")
@click.option("--into", "engine", type=click.Choice(["podman", "docker"]),
              help="The engine to load into (default: podman if installed, else docker).")
@click.option("--tag", "name", help="The name to give it there (default: the build's image tag).")
def load(source: str, engine: str | None, name: str | None) -> None:
    """Load an image the OCI writer built into podman's or docker's images, to run it there.

    SOURCE: a build dir packaged with --backend oci, or oci:DIR[:TAG].
    """
    result = load_image(source, engine, name)
    click.echo(f"loaded {result.tag} into {result.engine} (manifest {result.digest})", err=True)
    click.echo(f"run: {result.engine} run --rm -p {PORT}:{PORT} {result.tag}", err=True)
    click.echo(result.tag)


def _size(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def _validation(found: dict[str, object], labels: dict[str, str]) -> str:
    """One line: passed/FAILED and the gate's own summary, else the image's validation label."""
    if "passed" in found:
        return verdict(bool(found["passed"]), str(found.get("summary", "")))
    return str(found.get("label") or labels.get("dev.mbuild.validation") or "unknown")


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def inspect(target: str, as_json: bool) -> None:
    """Show TARGET's labels, profile, model commit, validation result and layer sizes.

    TARGET: a build dir, oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE, or a local image.
    """
    found = inspect_target(target)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2, sort_keys=True))
        return
    labels = found.labels
    click.echo(f"image       {found.name}")
    if found.digest:
        click.echo(f"digest      {found.digest}")
    click.echo(f"model       {labels.get('dev.mbuild.model.id', '?')} @ {labels.get('dev.mbuild.model.revision', '?')}")
    click.echo(f"profile     {labels.get('dev.mbuild.profile', '?')} ({labels.get('dev.mbuild.profile.id', '?')[:12]})")
    click.echo(f"engine      {labels.get('dev.mbuild.engine', '?')}, {labels.get('dev.mbuild.precision', '?')}")
    click.echo(f"validation  {_validation(found.validation, labels)}")
    click.echo("labels")
    for key in sorted(labels):
        click.echo(f"  {key}={labels[key]}")
    if found.layers:
        click.echo("layers")
        for made, size in found.layers:
            click.echo(f"  {_size(size):>12}  {made[:100]}")
        click.echo(f"  {_size(sum(s for _, s in found.layers)):>12}  total")
