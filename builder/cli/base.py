"""`mbuild base`: a Python base image from a Debian or Ubuntu package mirror, for hosts with no registry."""

from __future__ import annotations

import click

from builder.image.debian_base import DEFAULT_MIRROR, DEFAULT_SUITE, PACKAGES, make_base
from builder.settings import host_settings


@click.command()
@click.option("--suite", default=DEFAULT_SUITE, show_default=True,
              help="Debian or Ubuntu release (the image's packages are installed for its python3).")
@click.option("--mirror", default=lambda: host_settings().debian_mirror or DEFAULT_MIRROR, show_default=DEFAULT_MIRROR,
              help="Package mirror (an air-gapped site's own; snapshot.debian.org for a fixed state); "
                   "also MBUILD_DEBIAN_MIRROR.")
@click.option("--package", "extra", multiple=True, help="Another package to install (repeatable).")
@click.option("--force", is_flag=True, help="Make it again even if the cache holds it.")
def base(suite: str, mirror: str, extra: tuple[str, ...], force: bool) -> None:
    """Make a python3 base image as an OCI layout (cached), and print the --base-image that uses it.

    Needs mmdebstrap, or debootstrap as root, and the mirror; no container registry. The layer is
    reproducible: the same mirror state and SOURCE_DATE_EPOCH give the same digest.
    """
    result = make_base(suite, mirror, tuple(dict.fromkeys((*PACKAGES, *extra))), force)
    click.echo(f"base {result.reference}" + (" (cached)" if result.reused else ""), err=True)
    click.echo(f"digest {result.digest}", err=True)
    click.echo(f"use: mbuild package MODEL --base-image {result.reference}", err=True)
    click.echo(result.reference)
