"""The decoder families mbuild writes by hand (the fast lane), by transformers' `model_type`: the one list the
export, planning, the refusal of other models and docs/models.md read.

Each family is one module of this package, named by its model_type, whose RECORD (builder/model/family_record.py)
holds every fact about it that its config.json does not (a multimodal wrapper's RECORD is a Wrapper); this
registry finds them all, so adding a family is adding its module. Nothing outside these modules tests a family's
name (tests/unit/builder/model/test_family_records.py). A family here is one the streamed export
(builder/engine/decoder_graph.py) writes and the family test matrix (tests/support/family_configs.py) checks
against transformers (tests/unit/builder/engine/test_decoder_graph.py); a test keeps the two equal
(tests/unit/builder/model/test_models_doc.py).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Iterable

from builder.errors import UnsupportedModel
from builder.model.family_record import Family, Wrapper

__all__ = ["FAMILIES", "WRAPPERS", "Family", "Wrapper", "discover", "family", "fast_lane", "require_built",
           "takes_fast_lane", "wrapped_family"]


def discover(paths: Iterable[str], package: str) -> dict[str, Family | Wrapper]:
    """Every record module's RECORD under the package's paths, by model_type (which is its module's name)."""
    records: dict[str, Family | Wrapper] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(list(paths))):
        record = getattr(importlib.import_module(f"{package}.{module}"), "RECORD", None)
        if not isinstance(record, (Family, Wrapper)) or record.model_type != module:
            raise TypeError(f"{package}.{module} must define RECORD, a Family or Wrapper of model_type {module!r}")
        records[module] = record
    return records


_RECORDS = discover(__path__, __name__)
# dense families first, then mixtures of experts (docs/models.md's order)
FAMILIES: dict[str, Family] = {r.model_type: r for r in sorted(
    (r for r in _RECORDS.values() if isinstance(r, Family)), key=lambda r: (r.kind != "dense", r.model_type))}
# Any other wrapper (a config.json with a text_config inside) is refused by name.
WRAPPERS: dict[str, Wrapper] = {k: r for k, r in _RECORDS.items() if isinstance(r, Wrapper)}


def fast_lane(model_type: str | None) -> bool:
    """Whether a language model's graph is written by hand (decoder_graph.py) rather than traced from
    transformers' modeling code (builder/engine/generic/)."""
    return str(model_type or "") in FAMILIES


def takes_fast_lane(model_type: str | None, impl: str = "auto") -> bool:
    """Whether a language model is exported by the fast lane, by its type and the profile's model_impl
    (builder/planning/engine_options.py); the fast lane asked of a type it has no graph for is refused by name."""
    if impl == "fast-lane":
        family(model_type)
    return impl != "generic" and fast_lane(model_type)


def export_path(model_type: str, impl: str = "auto") -> str:
    """Which export builds a language model, and why, in one line: what `mbuild plan` and `package` say."""
    if takes_fast_lane(model_type, impl):
        return f"fast lane: mbuild's hand-written graph for {model_type!r} (builder/engine/decoder_graph.py)"
    why = "as --model-impl generic asks" if fast_lane(model_type) else "as no hand-written graph exists for it"
    return f"generic: traced from transformers' own {model_type!r} modeling code, {why} (builder/engine/generic/)"


def family(model_type: str | None) -> Family:
    """The family of a config's model_type, or the refusal that names it, the list and the nearest one."""
    name = str(model_type or "")
    found = FAMILIES.get(name)
    if found is not None:
        return found
    nearest = difflib.get_close_matches(name, list(FAMILIES), n=1, cutoff=0.4)
    near = f"; the nearest is {nearest[0]!r}, but a family is built only when its own layers are" if nearest else ""
    raise UnsupportedModel(f"language models of type {name or '(none)'!r} are not supported",
                           hint=f"supported families: {', '.join(sorted(FAMILIES))}{near}; see docs/models.md")


def wrapped_family(model_type: str, text_model_type: str | None) -> tuple[Family, Wrapper]:
    """The family a multimodal wrapper's text model is built as, or the refusal that names the wrapper."""
    wrapper = WRAPPERS.get(model_type)
    if wrapper is None or (text_model_type or wrapper.text_family) != wrapper.text_family:
        raise UnsupportedModel(
            f"multimodal models of type {model_type!r} (a {text_model_type or 'text'!r} model with other inputs) "
            "are not supported",
            hint=f"mbuild builds text-only models of the families {', '.join(sorted(FAMILIES))} and the text "
                 f"model of {', '.join(sorted(WRAPPERS))}; see docs/models.md")
    return FAMILIES[wrapper.text_family], wrapper


def require_built(wrapper: str, repo: str) -> None:
    """The refusal, before any download, of a known wrapper whose text model the export does not read yet (a
    wrapper without a record is the generic export's, builder/model/generic.py)."""
    known = WRAPPERS.get(wrapper)
    if known is None:
        return
    if not known.built:
        raise UnsupportedModel(
            f"{repo} is a multimodal {wrapper!r} model (a {known.text_family!r} text model with a vision tower); "
            "mbuild does not build the text model out of a multimodal checkpoint yet",
            hint=f"text-only {known.text_family} checkpoints are built (a repo or folder whose config.json has "
                 f"model_type {known.text_family!r}); see docs/models.md")
