"""The model-type sweep: every causal-LM model type transformers knows, made tiny (tiny_configs.py), packaged
fp32 by `mbuild package`, whose gate holds the engine's greedy decode to transformers' own. One row a type:
what the user sees (passed, refused with its one-line reason, failed, or a bug), the table docs/models.md
shows. `python -m tests.support.model_sweep OUT.json [TYPE ...]` runs it outside pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

PASSED, REFUSED, FAILED, BUG, NOT_TINY = "passed", "refused", "failed", "bug", "transformers cannot make it tiny"


@dataclass(frozen=True)
class Row:
    model_type: str
    outcome: str
    path: str  # fast lane | generic | "" where it did not build
    detail: str  # the refusal's or failure's line; the gate's verdict where it passed
    seconds: float = 0.0


def make_all(types: list[str], work: Path) -> dict[str, str]:
    """Each type's tiny model saved under `work`, in one process; the reason for each transformers cannot make."""
    # one forked child a type, its address space capped: a size field the rules miss cannot take the machine
    code = ("import json, os, pathlib, resource, signal, sys, torch\n"
            "from tests.support.tiny_configs import tiny_config\n"
            "from tests.support.tiny_models import save_random_decoder\n"
            "failed = {}\n"
            "for kind in sys.argv[2:]:\n"
            "    why = pathlib.Path(sys.argv[1]) / f'{kind}.why'\n"
            "    if os.fork() == 0:\n"
            "        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
            "        signal.alarm(120)\n"
            "        try:\n"
            "            save_random_decoder(tiny_config(kind), pathlib.Path(sys.argv[1]) / kind, torch.float32)\n"
            "            os._exit(0)\n"
            "        except BaseException as exc:\n"
            "            why.write_text(f'{type(exc).__name__}: {exc}'.splitlines()[0][:200])\n"
            "            os._exit(1)\n"
            "    if os.wait()[1]:\n"
            "        failed[kind] = why.read_text() if why.exists() else 'killed'\n"
            "print(json.dumps(failed))\n")
    made = subprocess.run([sys.executable, "-c", code, str(work), *types], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=True)
    return dict(json.loads(made.stdout.strip().splitlines()[-1]))


def _line(text: str, prefix: str) -> str:
    return next((line.removeprefix(prefix).strip() for line in text.splitlines() if line.startswith(prefix)), "")


def sweep_one(model_type: str, work: Path) -> Row:
    import time

    started = time.monotonic()
    folder = work / model_type
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MBUILD_ENGINE_CACHE": str(work / "engines"),
           "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-m", "builder.cli", "package", str(folder), "--gpu", "cpu", "--precision",
                          "fp32", "--backend", "none", "--output", str(work / f"{model_type}.out")],
                         capture_output=True, text=True, timeout=900, env=env)
    seconds = round(time.monotonic() - started, 1)
    out = run.stdout + run.stderr
    path = _line(out, "path").split(" ")[0] if "path " in out else ""
    if run.returncode == 0:
        return Row(model_type, PASSED, path, _line(out, "validation"), seconds)
    detail = _line(out, "error:") or _line(out, "internal error:") or out.strip().splitlines()[-1][:200]
    outcome = {7: REFUSED, 8: FAILED, 70: BUG}.get(run.returncode, f"exit {run.returncode}")
    return Row(model_type, outcome, path, detail[:300], seconds)


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def sweep(types: list[str], work: Path, jobs: int = 2) -> list[Row]:
    work.mkdir(parents=True, exist_ok=True)
    not_tiny = make_all(types, work)
    with ThreadPoolExecutor(jobs) as pool:
        built = dict(zip([t for t in types if t not in not_tiny],
                         pool.map(lambda t: sweep_one(t, work), [t for t in types if t not in not_tiny]), strict=True))
    return [built[t] if t in built else Row(t, NOT_TINY, "", not_tiny[t]) for t in types]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    rows = sweep(sys.argv[2:] or causal_lm_types(), out.with_suffix(".work"))
    out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    for r in rows:
        print(f"{r.model_type:28} {r.outcome:8} {r.seconds:6} {r.detail[:150]}")
