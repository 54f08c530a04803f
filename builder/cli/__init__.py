"""The `mbuild` command line. Click only: parse, call, format; the work happens in builder."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from builder.errors import MbuildError
from builder.settings import host_settings

INTERNAL_ERROR = 70


# Each command's module, imported only when that command runs (or --help lists them all): `mbuild serve` then loads
# what serving needs, not the builder's exporters and registry clients (0.6 s of a server's start, measured).
COMMANDS = {"package": "package", "plan": "plan", "profiles": "profiles", "serve": "serve", "bench": "bench",
            "push": "images", "load": "images", "inspect": "images", "deploy": "deploy", "base": "base",
            "cache": "cache", "doctor": "doctor"}


class MbuildGroup(click.Group):
    """Maps mbuild errors to a message, a hint and an exit code; no traceback reaches the user."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command = getattr(importlib.import_module(f"builder.cli.{COMMANDS[cmd_name]}"), cmd_name)
        return command if isinstance(command, click.Command) else None

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


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from builder import __version__  # read here: the other commands never need it

        click.echo(f"mbuild, version {__version__}")
        ctx.exit()


@click.group(cls=MbuildGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")
def cli() -> None:
    """Package Hugging Face models into optimized, validated, health-checked inference containers."""
    host_settings()  # every MBUILD_* (and HF_*) variable parsed now: a bad value stops here, before any work


def main() -> None:
    sys.exit(cli.main(prog_name="mbuild", standalone_mode=True))
