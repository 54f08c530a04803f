"""Qwen3 (modeling_qwen3.py): an RMSNorm on each head's queries and keys; the body of Qwen3-Reranker, whose
prompt recipe (its model card's, word for word: nothing in its config.json says how a pair becomes its input) is
written into engine.json for the runtime's pair tokenizer."""

from builder.model.family_record import Family, Layers
from runtimes.bundle.engine import RerankPrompt

RERANKER = RerankPrompt(  # Qwen/Qwen3-Reranker-0.6B, 4B and 8B share it
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
           "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n",
    template="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)

RECORD = Family("qwen3", "Qwen3", layers=Layers(qk_norm="head"), rerank=RERANKER)
