"""What a model is (task, size, shape): the catalog's facts, or its config.json's (fetched alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from builder.errors import UnsupportedModel
from builder.model.catalog import ModelFacts, Task, entry_for_repo
from builder.model.geometry import head_geometry
from builder.model.hubcache import hub_cache_dir, hub_endpoint
from builder.model.pull import hub_errors
from builder.model.ref import ModelRef
from builder.model.sources import ModelSpec

_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert", "nomic_bert",
                  "modernbert", "deberta-v2"}
_GATED_MLP_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "granite", "olmo2"}


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


def infer_task(files: tuple[str, ...], config: dict[str, Any], repo: str) -> Task:
    if {"modules.json", "sentence_bert_config.json"} & set(files):
        return "embedding"
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "text-generation"
    if str(config.get("model_type", "")).lower() in _ENCODER_TYPES:
        return "embedding"
    raise UnsupportedModel(
        f"cannot tell what task {repo} serves (model_type={config.get('model_type')!r}, "
        f"architectures={architectures})",
        hint="mbuild packages sentence-embedding encoders (BERT family) and causal language models",
    )


def facts_from_config(config: dict[str, Any], task: Task) -> ModelFacts:
    """Estimate the planning facts from a transformers config (parameters counted from the shapes)."""
    text = config.get("text_config") or config  # multimodal wrappers keep the LM's config inside
    try:
        hidden = int(text["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModel(f"config.json lacks {exc} needed to plan memory") from exc
    geometry = head_geometry(text)
    layers, heads, kv_heads, head_dim = geometry.layers, geometry.heads, geometry.kv_heads, geometry.head_dim
    inter = int(text.get("intermediate_size") or 4 * hidden)
    vocab = int(text.get("vocab_size") or 32000)
    context = int(text.get("max_position_embeddings") or 2048)
    attention = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    mlp = (3 if str(text.get("model_type", "")).lower() in _GATED_MLP_TYPES else 2) * hidden * inter
    tied = bool(text.get("tie_word_embeddings", task == "embedding"))
    embeddings = vocab * hidden * (1 if tied else 2)
    params = (layers * (attention + mlp) + embeddings) / 1e9
    return ModelFacts(task=task, params=float(f"{params:.4g}"), layers=layers, hidden=hidden, heads=heads,
                      kv_heads=kv_heads, head_dim=head_dim, context=context, vocab=vocab, tied=tied,
                      source="config.json")


def model_facts(ref: ModelRef, spec: ModelSpec, offline: bool) -> ModelFacts:
    """The catalog's facts for a catalog repo (no download); otherwise from config.json."""
    known = entry_for_repo(ref.repo)
    if known is not None:
        return known[1].facts()
    config = read_config(ref, spec, offline)
    return facts_from_config(config, infer_task(ref.files, config, ref.repo))
