"""The prompt recipes of rerankers on a decoder body, by the family they are trained on.

Such a reranker (Qwen3-Reranker) is a plain causal LM: nothing in its config.json says how a (query, document)
pair becomes its input, so the recipe is its model card's, kept here word for word. Planning refuses a decoder
reranker of a family without one; the export writes it into engine.json for the runtime's pair tokenizer.
"""

from __future__ import annotations

from builder.errors import UnsupportedModel
from runtimes.bundle.engine import RerankPrompt

QWEN3_RERANKER = RerankPrompt(  # Qwen/Qwen3-Reranker-0.6B, 4B and 8B share it
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
           "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n",
    template="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)
RECIPES: dict[str, RerankPrompt] = {"qwen3": QWEN3_RERANKER}  # model_type -> its rerankers' recipe


def recipe(model_type: str, repo: str) -> RerankPrompt:
    if model_type not in RECIPES:
        raise UnsupportedModel(
            f"{repo} is a reranker on a {model_type or 'decoder'} body: mbuild knows the prompt recipe of rerankers on "
            f"{', '.join(sorted(RECIPES))} (Qwen3-Reranker's) only, and a decoder reranker scores nothing useful "
            "without its own", hint="see docs/models.md for the rerankers mbuild builds")
    return RECIPES[model_type]
