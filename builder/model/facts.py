"""What a model is (task, size, shape): the catalog's facts, or its config.json's (fetched alone)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from builder.errors import UnsupportedModel
from builder.model.catalog import ModelFacts, Task, entry_for_repo
from builder.model.families import FAMILIES, WRAPPERS, require_built
from builder.model.generic import is_causal_lm
from builder.model.hubcache import hub_cache_dir, hub_endpoint
from builder.model.pull import hub_errors
from builder.model.ref import ModelRef
from builder.model.rerank_recipes import recipe
from builder.model.shape import facts_from_config
from builder.model.sources import ModelSpec

_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert", "nomic_bert",
                  "modernbert", "deberta-v2"}


def _one_file(spec: ModelSpec, name: str, sha: str | None, offline: bool) -> Path:
    """One file of the model, fetched alone from the hub (or the local folder's)."""
    if spec.local_path is not None:
        return spec.local_path / name
    with hub_errors(spec):
        return Path(hf_hub_download(spec.repo, name, revision=sha or spec.revision, cache_dir=hub_cache_dir(),
                                    local_files_only=offline, endpoint=hub_endpoint()))


def read_config(spec: ModelSpec, sha: str | None, offline: bool) -> dict[str, Any]:
    path = _one_file(spec, "config.json", sha, offline)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"config.json of {spec.repo} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnsupportedModel(f"config.json of {spec.repo} is not a JSON object")
    return data


def _labels(config: dict[str, Any]) -> int:
    """How many scores a classification head gives (transformers writes id2label; num_labels is older)."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    labels = config.get("num_labels", 2)  # transformers' default when neither is written
    return labels if type(labels) is int else 0


CARD_CHARS = 20_000  # of a model card read for its front matter


def ranks_text(card: str) -> bool:
    """Whether a model card's front matter tags the model for text ranking (Qwen3-Reranker's card: a causal LM by
    its config, a reranker by its pipeline_tag)."""
    if not card.startswith("---"):
        return False
    front = card[:CARD_CHARS].split("\n---", 1)[0]
    return re.search(r"^pipeline_tag:\s*['\"]?text-ranking['\"]?\s*$", front, re.MULTILINE) is not None


def _causal(config: dict[str, Any]) -> bool:
    return any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in config.get("architectures") or [])


def read_card(spec: ModelSpec, files: tuple[str, ...], sha: str | None, offline: bool) -> str:
    """The model card's head (README.md), or "" where it has none."""
    if "README.md" not in files:
        return ""
    try:
        with _one_file(spec, "README.md", sha, offline).open(errors="replace") as card:
            return card.read(CARD_CHARS)
    except OSError:
        return ""


def infer_task(files: tuple[str, ...], config: dict[str, Any], repo: str, card: str = "") -> Task:
    architectures = [str(a) for a in config.get("architectures") or []]
    model_type = str(config.get("model_type", "")).lower()
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        # Asked before modules.json: a cross-encoder saved by sentence-transformers has one too.
        labels = _labels(config)
        if model_type in _ENCODER_TYPES and labels == 1:
            return "rerank"
        what = (f"a reranker on a {model_type or 'decoder'} body, which mbuild does not build yet" if labels == 1
                else f"a classifier ({labels} labels), which mbuild does not build yet")
        raise UnsupportedModel(
            f"{repo} is a sequence-classification model ({', '.join(architectures)}): {what}; mbuild builds "
            f"rerankers on encoder bodies ({', '.join(sorted(_ENCODER_TYPES))}) with one label",
            hint="mbuild packages sentence-embedding encoders, cross-encoder rerankers, Qwen3-Reranker as "
                 "published (a causal LM) and causal language models; see docs/models.md")
    if {"modules.json", "sentence_bert_config.json"} & set(files):
        return "embedding"
    if _causal(config):
        if not ranks_text(card):
            return "text-generation"
        recipe(model_type, repo)  # a decoder reranker of a family whose recipe mbuild lacks: refused by name
        return "rerank"
    if model_type in _ENCODER_TYPES:
        return "embedding"
    if model_type in FAMILIES or model_type in WRAPPERS or isinstance(config.get("text_config"), dict) \
            or is_causal_lm(config):
        return "text-generation"  # the family, or the wrapper's refusal, decides from here
    raise UnsupportedModel(
        f"cannot tell what task {repo} serves (model_type={config.get('model_type')!r}, "
        f"architectures={architectures})",
        hint="mbuild packages sentence-embedding encoders (BERT family) and causal language models of the "
             f"families {', '.join(sorted(FAMILIES))}; see docs/models.md",
    )


def model_facts(spec: ModelSpec, ref: ModelRef | None, offline: bool) -> ModelFacts:
    """The catalog's facts for a catalog repo (no download); otherwise from config.json alone.

    A local folder needs no ref: its config.json is read before its files are chosen, so a model mbuild does
    not build is refused by its family rather than by a weights file it lacks."""
    known = entry_for_repo(spec.repo) if spec.local_path is None else None
    if known is not None:
        facts = known[1].facts()
    else:
        if spec.local_path is not None:
            files = tuple(p.name for p in spec.local_path.iterdir() if p.is_file())
        elif ref is not None:
            files = ref.files
        else:
            raise AssertionError("a hub model's facts need its resolved files")
        config = read_config(spec, ref.sha if ref else None, offline)
        card = read_card(spec, files, ref.sha if ref else None, offline) if _causal(config) else ""
        facts = facts_from_config(config, infer_task(files, config, spec.repo, card))
    if facts.wrapper:
        require_built(facts.wrapper, spec.repo)
    return facts
