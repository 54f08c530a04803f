"""mbuild's code at another commit, beside this checkout: the tree `git archive` writes at a ref, its CLI, and builds
made by that tree's own code (so a bundle's format is its own), for the scenarios that measure a commit's mbuild
against this checkout's (bench/scenarios/mixed_step.py, code_pair.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from contextlib import ExitStack
from pathlib import Path

from bench.lib.mbuild import ROOT
from bench.lib.servers import HOST, free_port, served_name, server
from runtimes.health import READY

# bench/lib/mbuild.py's build_or_engine as `tree` has it, run by `tree`'s Python path: the bundle (or why it did not
# build), whether it is one, and the gate's summary where only the gate failed, as the last line of its output
_BUILD_OR_ENGINE = ("import json, sys; from pathlib import Path; from bench.lib.mbuild import build_or_engine; "
                    "built, gate = build_or_engine(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]); "
                    "print(json.dumps([str(built), isinstance(built, Path), gate]))")


def tree_at(ref: str, work: Path) -> tuple[Path, str]:
    """The checkout's files at `ref` (what `git archive` writes), unpacked once under `work`; and its commit."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    folder = work / f"tree-{commit[:12]}"
    if not (folder / "builder").is_dir():
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(folder, filter="data")
    return folder, commit


def cli(tree: Path) -> tuple[list[str], dict[str, str]]:
    """mbuild's CLI from `tree`'s own code, run in `tree` (BentoML's workers import the service from the working
    directory): its folder first on the path, and -P so that `-m` puts no other folder before it."""
    return [sys.executable, "-P", "-m", "builder.cli"], {"PYTHONPATH": str(tree)}


def build(tree: Path, stamp: str, model: Path, work: Path) -> Path:
    """`mbuild package` of `model` by `tree`'s code at its default profile, cached per tree version."""
    out = work / f"mbuild-{model.name}-{stamp}"
    if not (out / "model" / "engine.json").is_file():
        command, env = cli(tree)
        print(f"  building with {stamp}'s mbuild", flush=True)
        subprocess.run([*command, "package", str(model), "--backend", "none", "--gpu", "cpu", "--output", str(out)],
                       check=True, env={**os.environ, **env}, cwd=tree, stdout=subprocess.DEVNULL)
    return out


def build_or_engine(tree: Path, model: Path, work: Path, precision: str) -> tuple[Path | str, str | None]:
    """bench/lib/mbuild.py's build_or_engine of `model` at `precision`, as `tree`'s own code has it (its CLI, its
    gate, its int8 KV cache for an engine that only missed the gate), cached in `work` per `tree`'s source version:
    the bundle or why it did not build, and the gate's summary where the engine is served with --allow-failed-gate.
    `tree` must have that function (bench/lib/mbuild.py since the bench was split into scenarios)."""
    _, env = cli(tree)
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-P", "-c", _BUILD_OR_ENGINE, str(model), str(work), precision],
                          env={**os.environ, **env}, cwd=tree, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"building {model.name} {precision} with the code in {tree} failed "
                           f"(exit {done.returncode}): {done.stderr[-1500:]}")
    built, is_bundle, gate = json.loads(done.stdout.strip().splitlines()[-1])
    return (Path(built) if is_bundle else built), gate


def serve(stack: ExitStack, tree: Path, bundle: Path, settings: dict[str, str], cpus: set[int],
          *args: str, started: list[int] | None = None) -> tuple[str, str]:
    """`mbuild serve BUNDLE ARGS` by `tree`'s code, up in `stack` on `cpus` with `settings` added to its environment
    (MBUILD_THREADS, ...): its /v1/completions URL and the model name it serves; `started` gets its process id."""
    port = free_port()
    command, env = cli(tree)
    stack.enter_context(server([*command, "serve", str(bundle), "--host", HOST, "--port", str(port), *args], READY,
                               port, {**env, **settings}, cpus=cpus, cwd=tree, started=started))
    return f"http://{HOST}:{port}/v1/completions", served_name(port)
