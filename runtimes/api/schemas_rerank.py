"""Request and response bodies of the reranking routes, in the three shapes clients already send.

- NIM's /v1/ranking: {query: {text}, passages: [{text}], truncate} -> {rankings: [{index, logit}]}, best first.
- The Cohere/Jina shape that vLLM, TEI and infinity-emb serve at /v1/rerank and /rerank (LangChain's and
  LlamaIndex's rerankers call it): {query, documents, top_n, return_documents} ->
  {results: [{index, relevance_score, document}]}, best first.
- vLLM's /v1/score: {text_1, text_2} -> {data: [{index, score}]}, in the pairs' order.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from runtimes.api.schemas import MAX_INPUTS, STRICT, Usage

MAX_QUERY_CHARS = 8192  # a query is tokenized again with every passage: this bounds that work per request
MAX_NAME = 256
RankTruncate = Literal["NONE", "END"]


class TextObject(BaseModel):
    model_config = STRICT
    text: str


class RankingRequest(BaseModel):
    """NIM's reranking request: over-long pairs are refused unless truncate is END (NIM's default is NONE)."""

    model_config = STRICT
    model: str | None = Field(None, max_length=MAX_NAME, description="The served model name (GET /v1/models).")
    query: TextObject
    passages: list[TextObject] = Field(min_length=1, max_length=MAX_INPUTS)
    truncate: RankTruncate = Field("NONE", description="END cuts an over-long pair, longest text first.")


class Ranking(BaseModel):
    index: int
    logit: float


class RankingResponse(BaseModel):
    rankings: list[Ranking]


class RerankRequest(BaseModel):
    """The Cohere/Jina rerank request. Over-long pairs are cut (longest text first) as Cohere and infinity-emb
    cut them, unless truncate is NONE."""

    model_config = STRICT
    model: str | None = Field(None, max_length=MAX_NAME, description="The served model name (GET /v1/models).")
    query: str
    documents: list[str | TextObject] = Field(min_length=1, max_length=MAX_INPUTS)
    top_n: int | None = Field(None, ge=1, le=MAX_INPUTS, description="Return only the best n (all by default).")
    return_documents: bool = False
    truncate: RankTruncate = "END"
    user: str | None = Field(None, max_length=MAX_NAME)

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class Document(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class ScoreRequest(BaseModel):
    """vLLM's score request: text_1 against each text_2, or the two lists paired in order."""

    model_config = STRICT
    model: str | None = Field(None, max_length=MAX_NAME, description="The served model name (GET /v1/models).")
    text_1: str | list[str] = Field(description="A query, or one per text_2.")
    text_2: str | list[str] = Field(description="A passage or a list of passages.")
    truncate: RankTruncate = "NONE"
    user: str | None = Field(None, max_length=MAX_NAME)

    @model_validator(mode="after")
    def _paired(self) -> ScoreRequest:
        firsts, seconds = self.firsts(), self.seconds()
        if not firsts or not seconds:
            raise ValueError("text_1 and text_2 must each hold at least one text")
        if len(seconds) > MAX_INPUTS or len(firsts) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} texts on each side")
        if len(firsts) not in (1, len(seconds)):
            raise ValueError(f"text_1 holds {len(firsts)} texts and text_2 {len(seconds)}: send one text_1, or "
                             "as many as text_2")
        return self

    def firsts(self) -> list[str]:
        return [self.text_1] if isinstance(self.text_1, str) else self.text_1

    def seconds(self) -> list[str]:
        return [self.text_2] if isinstance(self.text_2, str) else self.text_2

    def pairs(self) -> list[tuple[str, str]]:
        firsts, seconds = self.firsts(), self.seconds()
        return [(firsts[i % len(firsts)], passage) for i, passage in enumerate(seconds)]


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage
