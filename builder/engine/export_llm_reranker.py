"""Export a reranker on a decoder body that scores by its "yes" and "no" logits (Qwen3-Reranker's recipe).

Qwen3-Reranker is a plain causal LM: its model card formats each (query, document) pair into a chat prompt that
asks for "yes" or "no", and scores the pair by p(yes) over the two at the last position. That head is one vector:
softmax([no, yes])[yes] = sigmoid(logit_yes - logit_no), and logit_yes - logit_no = h . (W[yes] - W[no]) for the
last token's hidden state h. So the graph is the model's body, last-token pooling and a dot product with that
difference of two LM-head rows: a one-label reranker's graph, with no vocabulary-wide head per token. The prompt
is the runtime's (the family record's, builder/model/families/, written into engine.json), and the gate scores by
the card's own recipe in transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from builder.engine.export_encoder import export_graph, fast_tokenizer
from builder.engine.exported import ExportResult
from builder.engine.quiet import quiet_ml
from builder.errors import UnsupportedModel
from builder.model.rerank_recipes import recipe
from runtimes.bundle.engine import RerankOptions

OUTPUT_NAME = "score"
ANSWERS = ("yes", "no")
CARD_MAX_LENGTH = 8192  # the card's max_length for a formatted pair


def answer_ids(tokenizer: Any) -> tuple[int, int]:
    """The ids of the single tokens "yes" and "no" (the card's convert_tokens_to_ids)."""
    ids = [tokenizer.convert_tokens_to_ids(word) for word in ANSWERS]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise UnsupportedModel('the reranker\'s tokenizer has no single "yes" and "no" tokens, which its recipe '
                               "scores by", hint="check that this is Qwen3-Reranker or a fine-tune of it")
    return int(ids[0]), int(ids[1])


class _YesNoScorer(torch.nn.Module):
    def __init__(self, model: Any, yes: int, no: int) -> None:
        super().__init__()
        self.body = model.base_model
        head = model.get_output_embeddings()
        self.register_buffer("direction", (head.weight[yes] - head.weight[no]).detach().clone())
        bias = getattr(head, "bias", None)
        self.offset = float(bias[yes] - bias[no]) if bias is not None else 0.0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # The runtime pads on the right: the last token sits at length - 1 and, under causal attention, never saw
        # the padding after it.
        last = attention_mask.sum(dim=1) - 1
        pooled = hidden[torch.arange(hidden.shape[0]), last]
        return pooled @ self.direction + self.offset


@quiet_ml()
def export_llm_reranker(model_dir: Path, out_dir: Path, config: Any) -> ExportResult:
    """Write model.onnx and tokenizer.json to out_dir; return the engine.json fields they imply."""
    prompt = recipe(str(getattr(config, "model_type", "")), model_dir.name)
    tokenizer = fast_tokenizer(model_dir)
    yes, no = answer_ids(tokenizer)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                     torch_dtype=torch.float32).eval()
    except (ValueError, OSError) as exc:
        raise UnsupportedModel(f"transformers cannot load this model as a causal LM: {exc}") from exc
    inputs = export_graph(_YesNoScorer(model, yes, no), model, tokenizer, out_dir, OUTPUT_NAME, {0: "batch"})
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    positions = int(getattr(config, "max_position_embeddings", CARD_MAX_LENGTH) or CARD_MAX_LENGTH)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return ExportResult(task="rerank", inputs=inputs, output=OUTPUT_NAME,
                        max_seq_length=min(positions, CARD_MAX_LENGTH), geometry=None, pad_token_id=int(pad or 0),
                        options=RerankOptions(activation="sigmoid", prompt=prompt),
                        attention_heads=int(config.num_attention_heads))
