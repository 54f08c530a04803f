"""Is there a Python in the base image the runtime can start with? Read from the layers, no container.

The image's entrypoint is `python3 -m runtimes` and its packages are built for one Python version, so
the base must hold `python3` and `pythonX.Y` in a bin folder on PATH. Layers are read in order with
whiteouts applied; the answer is cached by the layers' digests, as layers never change.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path, PurePosixPath

from builder.errors import BaseImageError, InputError
from builder.oci.base import BaseImage
from builder.plan_record import PLAN_FILE, REWRITE_HINT, PlanRecord
from builder.resources import mbuild_cache_dir
from runtimes.bundle.codec import ContractError

BIN_DIRS = ("usr/local/bin", "usr/bin", "bin")
_WHITEOUT = ".wh."


def _executables(base: BaseImage) -> set[str]:
    """Paths (no leading /) of the files and links in BIN_DIRS the final filesystem holds."""
    present: set[str] = set()
    for _, blob in base.layers:
        try:
            with tarfile.open(blob, "r|gz") as tar:
                for member in tar:
                    path = PurePosixPath(member.name.removeprefix("./"))
                    if str(path.parent) not in BIN_DIRS:
                        continue
                    if path.name.startswith(_WHITEOUT):
                        present.discard(str(path.parent / path.name.removeprefix(_WHITEOUT)))
                    elif member.isfile() or member.issym() or member.islnk():
                        present.add(str(path))
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BaseImageError(f"base {base.source}: cannot read a layer ({blob.name[:12]}): {exc}") from exc
    return present


def _cached_executables(base: BaseImage) -> set[str]:
    key = hashlib.sha256(" ".join(d.digest for d, _ in base.layers).encode()).hexdigest()[:24]
    cache = mbuild_cache_dir() / "bases" / f"bin-{key}.json"
    try:
        return set(json.loads(cache.read_text()))
    except (OSError, ValueError):
        found = _executables(base)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(sorted(found)))
    except OSError:
        pass  # only the next check is slower
    return found


def check_python(base: BaseImage, version: str | None) -> None:
    """BaseImageError unless the base holds python3 (and python<version>, when one is asked for)."""
    found = _cached_executables(base)
    names = {PurePosixPath(p).name for p in found}
    wanted = ["python3"] + ([f"python{version}"] if version else [])
    missing = [name for name in wanted if name not in names]
    if missing:
        pythons = sorted(n for n in names if n.startswith("python")) or ["none"]
        raise BaseImageError(
            f"base image {base.source} has no {' or '.join(missing)} in {', '.join('/' + d for d in BIN_DIRS)} "
            f"(Pythons found: {', '.join(pythons)}); the runtime could not start in it",
            hint=f"use a base with Python {version or '3'}: `mbuild base` makes one from a Debian mirror, or "
                 f"--base-image python:{version or '3.11'}-slim from a registry")


def plan_python(context: Path) -> str | None:
    """The Python version the build's packages were made for, from its plan.json; None for a context without one
    (then any python3 will do)."""
    path = context / PLAN_FILE
    if not path.is_file():
        return None
    try:
        return PlanRecord.parse(path.read_text(), str(path)).requires.python
    except (OSError, ContractError) as exc:
        raise InputError(f"the build context's {PLAN_FILE} cannot be read: {exc}", hint=REWRITE_HINT) from exc
