"""Cross-encoders on every encoder body a reranker ships on (XLM-R: bge-reranker; ModernBERT; DeBERTa-v2:
mxbai-rerank), tiny and random (initialized wide, so their logits spread), packaged through the real pipeline and
gated against sentence-transformers' CrossEncoder. Random weights prove the export's plumbing and fp32
exactness, not ranking quality (tests/unit/builder/engine/test_rerank.py's trained model does that)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf

from builder.build.pipeline import package
from builder.build.plan_package import PackageOptions
from builder.errors import UnsupportedModel
from builder.progress import Reporter
from runtimes.bundle import load_engine_config
from tests.support.tiny_models import wordpiece

pytestmark = pytest.mark.slow
COMMON = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
          "max_position_embeddings": 64, "num_labels": 1, "initializer_range": 0.3, "pad_token_id": 0}
# name: (config class, head, extra config, whether the tokenizer gives token types, the graph's inputs, pair limit)
BODIES: dict[str, tuple[Any, Any, dict[str, Any], bool, list[str], int]] = {
    # XLM-R has one token type and a tokenizer that gives none; its positions start past the padding index.
    "xlm-roberta": (tf.XLMRobertaConfig, tf.XLMRobertaForSequenceClassification, {"type_vocab_size": 1}, False,
                    ["input_ids", "attention_mask"], 62),
    "modernbert": (tf.ModernBertConfig, tf.ModernBertForSequenceClassification,
                   {"global_attn_every_n_layers": 1, "local_attention": 16}, False,
                   ["input_ids", "attention_mask"], 64),
    # DeBERTa-v2 reads no token types (type_vocab_size 0) though its forward takes them: the export drops the input.
    "deberta-v2": (tf.DebertaV2Config, tf.DebertaV2ForSequenceClassification, {}, True,
                   ["input_ids", "attention_mask"], 64),
}


def cross_encoder(folder: Path, body: str, types: bool | None = None) -> Path:
    config_class, head, extra, gives_types, _, _ = BODIES[body]
    tok, _ = wordpiece(folder, types=gives_types if types is None else types)
    torch.manual_seed(0)
    head(config_class(vocab_size=tok.get_vocab_size(), **COMMON, **extra)).eval().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("body", BODIES)
def test_each_body_builds_and_passes_the_gate(tmp_path: Path, body: str) -> None:
    out = tmp_path / "build"
    report = package(PackageOptions(model=str(cross_encoder(tmp_path / "model", body)), output=out, backend="none"),
                     Reporter(quiet=True)).report
    config = load_engine_config(out / "model")
    assert config.task == "rerank" and list(config.inputs) == BODIES[body][4]
    assert config.max_seq_length == BODIES[body][5]
    assert report is not None and report.passed, report
    logits = [pair["reference"] for pair in json.loads((out / "report.json").read_text())["pairs"]]
    assert max(logits) - min(logits) > 0.5  # the gate compared logits that differ, not one constant


def test_a_tokenizer_that_breaks_its_own_model_is_refused_by_name(tmp_path: Path) -> None:
    """An XLM-R head (one token type) beside a tokenizer that gives the passage type 1: transformers itself
    cannot run the pair, so the build stops with that said, not as a bug of mbuild's."""
    folder = cross_encoder(tmp_path / "model", "xlm-roberta", types=True)
    with pytest.raises(UnsupportedModel, match="cannot score a \\(query, passage\\) pair with its own tokenizer"):
        package(PackageOptions(model=str(folder), output=tmp_path / "build", backend="none"), Reporter(quiet=True))
