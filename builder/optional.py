"""Optional build-time parts (torch, transformers, sentence-transformers) are imported on demand.

`mbuild --help`, `plan` and `serve` must stay fast and work without them; a stage that needs
them says how to install them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from builder.errors import ToolMissing

_INSTALL_HINT = (
    "install the export extra: pip install torch --index-url https://download.pytorch.org/whl/cpu "
    "&& pip install 'mbuild[export]'"
)


def load_stage(module: str, purpose: str) -> ModuleType:
    """Import a stage module whose own imports need the optional extras."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name or str(exc)
        raise ToolMissing(f"{purpose} needs the Python package {missing!r}, which is not installed",
                          hint=_INSTALL_HINT) from exc
