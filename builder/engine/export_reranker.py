"""Export a cross-encoder reranker (an encoder with a one-label classification head) to ONNX; a reranker on a
decoder body goes to export_llm_reranker.py.

The graph takes a query and passage tokenized as one pair (input ids, mask, and token types where the model has
them) with dynamic batch and sequence axes, and returns the head's logit per pair ("score"). The activation that
turns a logit into a relevance score (sigmoid unless the model's sentence-transformers config names another) is
the runtime's, so NIM's /v1/ranking can return the logit and the Cohere-shaped routes the score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from builder.engine.export_encoder import export_graph, fast_tokenizer
from builder.engine.export_llm_reranker import export_llm_reranker
from builder.engine.exported import ExportResult
from builder.engine.quiet import quiet_ml
from builder.errors import UnsupportedModel
from builder.model.families import FAMILIES
from runtimes.bundle.engine import RerankOptions

OUTPUT_NAME = "score"
# sentence-transformers' CrossEncoder writes its activation as a class path (config.json's
# sentence_transformers.activation_fn; before its v4, sbert_ce_default_activation_function).
ACTIVATIONS: dict[str, Literal["sigmoid", "identity"]] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity", "torch.nn.Identity": "identity",
}
# RoBERTa's position ids start after the padding index: two of max_position_embeddings are never a token's.
OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


def activation(config: Any) -> Literal["sigmoid", "identity"]:
    """The activation CrossEncoder.predict applies to this model's logit."""
    st = getattr(config, "sentence_transformers", None)
    path = st.get("activation_fn") if isinstance(st, dict) else None
    path = path or getattr(config, "sbert_ce_default_activation_function", None)
    if path is None:
        return "sigmoid"  # CrossEncoder's default for one label
    if path not in ACTIVATIONS:
        raise UnsupportedModel(f"the reranker's activation {path!r} is not supported",
                               hint=f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[path]


def longest_pair(config: Any, tokenizer: Any) -> int:
    """Tokens a pair may hold: the position table's, or the tokenizer's limit where it is lower."""
    positions = int(getattr(config, "max_position_embeddings", 512) or 512)
    positions -= OFFSET_POSITIONS.get(str(getattr(config, "model_type", "")), 0)
    limit = getattr(tokenizer, "model_max_length", None)
    return min(positions, int(limit)) if isinstance(limit, int) and 0 < limit < positions else positions


class _Scorer(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return logits[:, 0]


@quiet_ml()
def export_reranker(model_dir: Path, out_dir: Path) -> ExportResult:
    """Write model.onnx and tokenizer.json to out_dir; return the engine.json fields they imply."""
    config = AutoConfig.from_pretrained(model_dir)
    if str(getattr(config, "model_type", "")) in FAMILIES:  # a causal LM scoring by its answer tokens
        return export_llm_reranker(model_dir, out_dir, config)
    if int(getattr(config, "num_labels", 0)) != 1:
        raise UnsupportedModel(f"a reranker has one label; this model's head has {config.num_labels}",
                               hint="classifiers are not built yet; see docs/models.md")
    how = activation(config)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    except (ValueError, OSError) as exc:
        raise UnsupportedModel(f"transformers cannot load this model as a cross-encoder: {exc}") from exc
    tokenizer = fast_tokenizer(model_dir)
    inputs = export_graph(_Scorer(model), model, tokenizer, out_dir, OUTPUT_NAME, {0: "batch"})
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    return ExportResult(task="rerank", inputs=inputs, output=OUTPUT_NAME,
                        max_seq_length=longest_pair(config, tokenizer), geometry=None,
                        pad_token_id=int(tokenizer.pad_token_id or 0), options=RerankOptions(activation=how),
                        attention_heads=int(config.num_attention_heads))
