"""`mbuild package TARGET --draft DRAFT`: a speculative-decoding draft model built beside the target, into
model/draft/ (runtimes/bundle/metadata.py's DRAFT_DIR), with the target's profile.

The draft is an engine like any: exported, compiled and gated against its own checkpoint, cached under its own key.
It must speak the target's tokens: the two tokenizers' vocabularies (every token and id, added tokens too) must be
the same, checked before the draft's export on its checkpoint's tokenizer.json (one it must have), and on the
engines' own files after. Their logits may have different rows (a padded embedding, as Qwen2.5's sizes have): the
runtime drafts over the rows both have. Its memory (weights, and a KV cache for each of the target's slots) is in
the plan's.
The runtime's half is runtimes/generation/draft.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tokenizers import Tokenizer

from builder.engine import cache as engine_cache
from builder.engine.make import make_engine
from builder.engine.report import GateReport
from builder.errors import InputError
from builder.model.catalog import ModelFacts
from builder.model.facts import model_facts
from builder.model.pull import pull, resolve, resolve_or_defer
from builder.model.sources import parse_model_ref
from builder.planning.memory import memory_need
from builder.planning.plan import BuildPlan, DraftPlan
from builder.planning.profiles import Profile
from builder.progress import Reporter
from runtimes.bundle.metadata import DRAFT_DIR

TOKENIZER = "tokenizer.json"


def plan_draft(model: str, target: ModelFacts, profile: Profile, offline: bool, *,
               for_plan_only: bool = False) -> DraftPlan:
    """The draft's pinned checkpoint, facts and memory under the target's profile; refused where it cannot draft."""
    if not model.strip():
        raise InputError("--draft is empty", hint="name the draft model (a folder, org/name or an alias), or leave "
                                                  "--draft out")
    spec = parse_model_ref(model)
    if target.task != "text-generation":
        article = "an" if target.task[0] in "aeiou" else "a"
        raise InputError(f"--draft: draft models are for language models (speculative decoding drafts the tokens "
                         f"they generate), and the target is {article} {target.task} model",
                         hint="leave --draft out for it")
    early = model_facts(spec, None, offline) if spec.local_path is not None else None
    ref = resolve_or_defer(spec, offline) if for_plan_only else resolve(spec, offline)
    facts = early or model_facts(spec, ref, offline)
    if facts.task != "text-generation":
        raise InputError(f"--draft {model} is a {facts.task} model; a draft model is a language model",
                         hint="name a smaller checkpoint of the target's family, with the same tokenizer")
    if profile.engine != "onnxruntime":
        raise InputError(f"--draft: profile {profile.name} builds a TensorRT engine, which takes no multi-token "
                         "step over a past, so it cannot verify drafts",
                         hint="build for a CPU profile (ONNX Runtime) to carry a draft model, or drop --draft")
    if ref.files and TOKENIZER not in ref.files:  # a deferred plan's ref lists no files yet
        raise InputError(f"--draft {model} has no {TOKENIZER}, so mbuild cannot check that it speaks the target's "
                         "tokens",
                         hint=f"copy the target's {TOKENIZER} (and tokenizer_config.json) into the draft's folder, "
                              "or pick a draft released with the target's tokenizer")
    return DraftPlan(ref, facts, memory_need(facts, profile))


def _vocabulary(path: Path) -> dict[str, int]:
    try:
        return dict(Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise InputError(f"cannot read the tokenizer {path}: {exc}") from exc


def check_tokenizers(target: Path, draft: Path, name: str) -> None:
    ours, theirs = _vocabulary(target), _vocabulary(draft)
    if ours != theirs:
        differ = sorted(set(ours.items()) ^ set(theirs.items()))[:3]
        raise InputError(f"--draft {name}: its tokenizer is not the target's ({len(theirs)} tokens against "
                         f"{len(ours)}; e.g. {differ})",
                         hint="a draft model must share the target's tokenizer: pick a smaller model of the same "
                              "family and release")


def build_draft(plan: BuildPlan, model: str, offline: bool, work: Path, engine_dir: Path,
                reporter: Reporter) -> GateReport:
    """The draft's engine into engine_dir/DRAFT_DIR (engine_dir holds the target's already); its gate report."""
    assert plan.draft is not None
    draft = plan.draft
    draft_plan = dataclasses.replace(plan, model=draft.model, facts=draft.facts, need=draft.need, draft=None)
    folder, draft_work = engine_dir / DRAFT_DIR, work / DRAFT_DIR
    draft_work.mkdir(parents=True, exist_ok=True)
    with reporter.stage("download", f"draft model: {len(draft.model.files)} files of {draft.model.repo}"):
        snapshot = pull(draft.model, parse_model_ref(model), offline)
    if (snapshot / TOKENIZER).is_file():  # before an export that would be wasted
        check_tokenizers(engine_dir / TOKENIZER, snapshot / TOKENIZER, model)
    key = engine_cache.engine_key(draft_plan)
    hit = engine_cache.cached(key)
    if hit is not None and (report := engine_cache.restore(hit, folder, draft_plan)) is not None:
        reporter.skipped("draft engine", f"reused the validated draft engine {hit.name[:12]} from mbuild's cache")
    else:
        report = make_engine(draft_plan, snapshot, draft_work, folder, draft_work, reporter)
        try:
            engine_cache.store(key, folder)
        except OSError as exc:
            reporter.note(f"draft engine not cached: {exc}")
    check_tokenizers(engine_dir / TOKENIZER, folder / TOKENIZER, model)
    reporter.note(f"draft model {draft.model.repo}: {report.summary}")
    return report
