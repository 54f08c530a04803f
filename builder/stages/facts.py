"""What kind of model a repo holds, from its file list and config.json (fetched alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from builder.catalog import Task, lookup_alias
from builder.errors import UnsupportedModel
from builder.hubcache import hub_cache_dir, hub_endpoint
from builder.sources import ModelSpec
from builder.stages.pull import ModelRef, hub_errors

_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert", "nomic_bert",
                  "modernbert", "deberta-v2"}


def read_config(ref: ModelRef, spec: ModelSpec, offline: bool) -> dict[str, Any]:
    if ref.local_path is not None:
        path = ref.local_path / "config.json"
    else:
        with hub_errors(spec):
            path = Path(hf_hub_download(ref.repo, "config.json", revision=ref.sha, cache_dir=hub_cache_dir(),
                                        local_files_only=offline, endpoint=hub_endpoint()))
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"config.json of {ref.repo} is not readable JSON: {exc}") from exc
    return data


def infer_task(ref: ModelRef, config: dict[str, Any]) -> Task:
    entry = lookup_alias(ref.alias) if ref.alias else None
    if entry is not None:
        return entry.task
    if {"modules.json", "sentence_bert_config.json"} & set(ref.files):
        return "embedding"
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "text-generation"
    if str(config.get("model_type", "")).lower() in _ENCODER_TYPES:
        return "embedding"
    raise UnsupportedModel(
        f"cannot tell what task {ref.repo} serves (model_type={config.get('model_type')!r}, "
        f"architectures={architectures})",
        hint="mbuild packages sentence-embedding encoders (BERT family) and causal language models",
    )
