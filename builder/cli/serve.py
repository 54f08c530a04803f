"""`mbuild serve BUILD_DIR`: run a build's service on this host, as the image would."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from builder.errors import InputError
from builder.resources import runtimes_dir


@click.command()
@click.argument("build_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
def serve(build_dir: Path, host: str, port: int) -> None:
    """Serve BUILD_DIR's model with the same runtime the image runs."""
    model_dir = build_dir / "model"
    if not (model_dir / "engine.json").is_file():
        raise InputError(f"{build_dir} is not an mbuild build directory (no model/engine.json)",
                         hint="give the folder that `mbuild package` printed as 'build dir'")
    env = {**os.environ, "MBUILD_MODEL_DIR": str(model_dir.resolve())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(runtimes_dir().parent), env.get("PYTHONPATH")]))
    click.echo(f"serving {build_dir} on http://{host}:{port} (Ctrl+C stops)", err=True)
    # exec, not a child process: signals (Ctrl+C, SIGTERM from a supervisor) reach the server itself.
    os.execve(sys.executable, [sys.executable, "-m", "runtimes", "--host", host, "--port", str(port)], env)
