"""The prompt recipes of rerankers on a decoder body, by the family they are trained on.

Such a reranker (Qwen3-Reranker) is a plain causal LM: nothing in its config.json says how a (query, document)
pair becomes its input, so the recipe is its model card's, kept word for word in its family's record
(builder/model/families/, Family.rerank). Planning refuses a decoder reranker of a family without one; the export
writes it into engine.json for the runtime's pair tokenizer.
"""

from __future__ import annotations

from builder.errors import UnsupportedModel
from builder.model.families import FAMILIES
from runtimes.bundle.engine import RerankPrompt

RECIPES: dict[str, RerankPrompt] = {name: f.rerank for name, f in FAMILIES.items() if f.rerank}  # by model_type


def recipe(model_type: str, repo: str) -> RerankPrompt:
    if model_type not in RECIPES:
        raise UnsupportedModel(
            f"{repo} is a reranker on a {model_type or 'decoder'} body: mbuild knows the prompt recipe of rerankers on "
            f"{', '.join(sorted(RECIPES))} only, and a decoder reranker scores nothing useful without its own",
            hint="see docs/models.md for the rerankers mbuild builds")
    return RECIPES[model_type]
