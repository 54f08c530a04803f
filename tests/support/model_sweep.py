"""The model-type sweep: every causal-LM model type transformers knows, made tiny (tiny_configs.py), planned,
exported fp32 and gated as `mbuild package` does it, where the gate holds the engine's greedy decode (its
serving scheduler, 4 prompts x 32 tokens, past every window and chunk of 16) to transformers' own forward. One
row a type: what a user sees (passed, refused with its one-line reason, failed the gate, or a bug), the table
docs/models.md shows (builder/model/models_doc.py reads profiles/model_sweep.json). The sweep measures: its
build processes do not consult that record (builder/model/measured.py).

The stages run in one process a type (forked from a server that imported them once), not through the CLI: the
CLI's own export child (export_worker.py) spends most of a tiny build importing PyTorch, which 196 builds cannot
afford. The child's address space is capped, so a size the rules miss cannot take the machine.
`python -m tests.support.model_sweep OUT.json [TYPE ...]` runs it outside pytest."""

from __future__ import annotations

import json
import multiprocessing
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path

PASSED, REFUSED, FAILED, BUG, NOT_TINY = "passed", "refused", "failed", "bug", "not made tiny"
CHILD_BYTES, CHILD_SECONDS = 8 << 30, 600
NODE_NAME = re.compile(r"Name:'[^']*'")


@dataclass(frozen=True)
class Row:
    model_type: str
    outcome: str
    path: str  # fast lane | generic | "" where nothing was built
    detail: str  # the refusal's or failure's line; the gate's verdict where it passed
    stage: str = ""  # where it ended: plan (before any download), export or gate
    seconds: float = 0.0


def _build(model_type: str, work: Path) -> Row:
    """In the forked child: make, plan, export, gate."""
    from builder.build.plan_package import PackageOptions, plan_package
    from builder.engine.export_decoder import export_decoder
    from builder.engine.make import _compile
    from builder.engine.validate_decoder import run_gate
    from builder.errors import MbuildError, UnsupportedModel, ValidationFailed
    from builder.model.families import fast_lane
    from builder.progress import Reporter
    from tests.support.tiny_models import make_tiny_llama

    folder = work / model_type
    try:
        make_tiny_llama(folder, train_steps=0, family=model_type)  # random weights: fp32 exactness is the point
        _runs(folder)
    except Exception as exc:  # transformers' own classes refuse these sizes, cannot make or cannot run the model
        return Row(model_type, NOT_TINY, "", f"{type(exc).__name__}: {exc}".splitlines()[0][:200], "make")
    path = "fast lane" if fast_lane(model_type) else "generic"
    out = work / f"{model_type}.out"
    stage = "plan"
    try:
        plan = plan_package(PackageOptions(str(folder), gpu="cpu", precision="fp32", offline=True),
                            Reporter(quiet=True))
        stage = "export"
        exported = export_decoder(folder, out / "work", plan.profile)
        _compile(plan, out / "work", out / "engine", exported, built=True)
        stage = "gate"
        report = run_gate(folder, out / "engine", plan.profile.tolerance, out / "report.json")
        return Row(model_type, PASSED, path, report.verdict, stage)
    except UnsupportedModel as exc:
        return Row(model_type, REFUSED, "", exc.message.splitlines()[0][:300], stage)
    except ValidationFailed as exc:  # ONNX Runtime's node names are the exporter's numbering: not part of the row
        return Row(model_type, FAILED, path, NODE_NAME.sub("Name:(a node)", exc.message.splitlines()[0])[:300], stage)
    except MbuildError as exc:
        return Row(model_type, BUG, path, f"{type(exc).__name__}: {exc.message}".splitlines()[0][:300], stage)
    except Exception as exc:
        return Row(model_type, BUG, path, "".join(traceback.format_exception_only(exc)).strip()[:300], stage)


def _runs(folder: Path) -> None:
    """transformers' own forward runs on the tiny model, else it is not one transformers can make tiny."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 5, 7, 9]]))


def _child(model_type: str, work: str) -> None:
    """One type's build in its own process, its address space and time capped; its row left in a file."""
    from builder.model.measured import CONSULTED

    CONSULTED["on"] = False
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_BYTES, CHILD_BYTES))
    signal.alarm(CHILD_SECONDS)
    row = _build(model_type, Path(work))
    (Path(work) / f"{model_type}.row.json").write_text(json.dumps(asdict(row)))


def sweep_one(model_type: str, work: Path, context: ForkServerContext) -> Row:
    started = time.monotonic()
    result = work / f"{model_type}.row.json"
    child = context.Process(target=_child, args=(model_type, str(work)))
    child.start()
    child.join()
    seconds = round(time.monotonic() - started, 1)
    if not result.is_file():
        return Row(model_type, BUG, "", f"the build process died (exit {child.exitcode})", "", seconds)
    return Row(**{**json.loads(result.read_text()), "seconds": seconds})


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def sweep(types: list[str], work: Path, jobs: int = 2) -> list[Row]:
    """Every type's row. The children fork from a fresh server process that has imported the stages once (not
    from the caller, whose threads, PyTorch's OpenMP pool among them, a forked child could hang on)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["builder.engine.export_decoder", "builder.engine.generic.reference",
                                    "builder.engine.validate_decoder", "tests.support.model_sweep"])
    work.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda t: sweep_one(t, work, context), types))


def table(rows: list[Row]) -> dict[str, object]:
    """profiles/model_sweep.json's content: the transformers version and each type's row, its time left out."""
    import transformers

    return {"transformers": transformers.__version__, "rows": [recorded(r) for r in rows]}


def recorded(row: Row) -> dict[str, object]:
    """A row as the record keeps it: its time left out (it is the machine's, not the model's)."""
    return {k: v for k, v in asdict(row).items() if k != "seconds"}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as scratch:  # no machine's paths in a row, no work left beside the table
        rows = sweep(sys.argv[2:] or causal_lm_types(), Path(scratch))
    out.write_text(json.dumps(table(rows), indent=1) + "\n")
    for r in rows:
        print(f"{r.model_type:28} {r.outcome:8} {r.seconds:6} {r.detail[:150]}")
