"""The `mbuild` command line. Click only: parse, call, format; the work happens in builder."""

from __future__ import annotations

import sys
from typing import Any

import click

from builder import __version__
from builder.cli.base import base
from builder.cli.bench import bench
from builder.cli.cache import cache
from builder.cli.deploy import deploy
from builder.cli.doctor import doctor
from builder.cli.images import inspect, load, push
from builder.cli.package import package
from builder.cli.plan import plan
from builder.cli.profiles import profiles
from builder.cli.serve import serve
from builder.errors import MbuildError
from builder.settings import host_settings

INTERNAL_ERROR = 70


class MbuildGroup(click.Group):
    """Maps mbuild errors to a message, a hint and an exit code; no traceback reaches the user."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MbuildError as exc:
            click.secho(f"error: {exc.message}", fg="red", err=True)
            if exc.hint:
                click.echo(f"hint: {exc.hint}", err=True)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            if host_settings().debug:  # checked at start (cli below), so it cannot fail here
                raise
            click.secho(f"internal error: {type(exc).__name__}: {exc}", fg="red", err=True)
            click.echo("hint: this is a bug in mbuild; rerun with MBUILD_DEBUG=1 for the traceback and report it",
                       err=True)
            ctx.exit(INTERNAL_ERROR)


@click.group(cls=MbuildGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mbuild")
def cli() -> None:
    """Package Hugging Face models into optimized, validated, health-checked inference containers."""
    host_settings()  # every MBUILD_* (and HF_*) variable parsed now: a bad value stops here, before any work


for command in (package, plan, profiles, serve, bench, push, load, inspect, deploy, base, cache, doctor):
    cli.add_command(command)


def main() -> None:
    sys.exit(cli.main(prog_name="mbuild", standalone_mode=True))
