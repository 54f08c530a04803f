"""A language model's export, run in a child process: `python -m builder.engine.export_worker`.

The export reads the tokenizer, the config and the rotary tables through transformers, which loads
PyTorch (~0.5 GB resident that never goes back). Run in the build process, that memory would sit beside
the engine the gate runs next; for an 8B int8 engine (7.6 GB) it is what pushes the build past 8 GB.
The child's errors come back as the same MbuildError, message and hint; anything else is a bug.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

from builder import errors
from builder.engine.exported import ExportResult
from builder.optional import load_stage
from builder.planning.profiles import Profile

RESULT, ERROR = "export.json", "export-error.json"


def run_export(where: str, snapshot: Path, work: Path, profile: Profile) -> ExportResult:
    """where: "module:function" of an export taking (model_dir, out_dir, profile)."""
    for name in (RESULT, ERROR):
        (work / name).unlink(missing_ok=True)
    child = subprocess.run([sys.executable, "-m", __name__, where, str(snapshot), str(work)],
                           input=profile.model_dump_json(), text=True, capture_output=True, check=False)
    if (work / ERROR).is_file():
        failure = json.loads((work / ERROR).read_text())
        kind = getattr(errors, failure["type"], errors.MbuildError)
        raise kind(failure["message"], hint=failure["hint"])
    if child.returncode != 0 or not (work / RESULT).is_file():
        tail = "\n".join((child.stderr or "").strip().splitlines()[-15:])
        raise errors.MbuildError(f"the export process ended with status {child.returncode}; this is a bug in "
                                 f"mbuild:\n{tail}")
    return ExportResult.load(work / RESULT)


def main(argv: list[str]) -> int:
    where, snapshot, work = argv
    module, _, function = where.partition(":")
    try:
        export = getattr(load_stage(module, "exporting to ONNX"), function)
        profile = Profile.model_validate_json(sys.stdin.read())
        result: ExportResult = export(Path(snapshot), Path(work), profile)
    except errors.MbuildError as exc:
        failure = {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        (Path(work) / ERROR).write_text(json.dumps(failure))
        return 1
    except Exception:
        traceback.print_exc()
        return 70
    result.save(Path(work) / RESULT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
