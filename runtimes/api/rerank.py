"""Reranking routes: NIM's POST /v1/ranking, the Cohere/Jina POST /v1/rerank, /rerank and /v2/rerank, and vLLM's
POST /v1/score (schemas_rerank.py has their shapes). Every one scores (query, passage) pairs through the same
admission, batcher and engine; they differ in what they return: the logit (ranking), or the model's relevance
score, which is the logit through its activation (rerank, score)."""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Depends, Request

from runtimes.api.admission import encoded, rerank_runtime, served
from runtimes.api.auth import require_key
from runtimes.api.bodies import openapi_body, parse_body
from runtimes.api.errors import ApiError, OpenAIRoute
from runtimes.api.schemas import Usage
from runtimes.api.schemas_rerank import (
    MAX_QUERY_CHARS,
    Document,
    Ranking,
    RankingRequest,
    RankingResponse,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from runtimes.ids import hex_id
from runtimes.state import RerankRuntime
from runtimes.tokenize import InputTooLong, Truncate

router = APIRouter(route_class=OpenAIRoute, dependencies=[Depends(require_key)])


async def score_pairs(request: Request, runtime: RerankRuntime, pairs: list[tuple[str, str]], truncate: Truncate,
                      hint: str) -> tuple[np.ndarray, int]:
    """The engine's logit per (query, passage) pair, and the pairs' tokens."""
    for query in dict.fromkeys(query for query, _ in pairs):
        if not query.strip():
            raise ApiError(400, "a query is empty or only spaces", "empty_input")
        if len(query) > MAX_QUERY_CHARS:  # it is tokenized again with every passage
            raise ApiError(400, f"a query holds {len(query)} characters; at most {MAX_QUERY_CHARS}",
                           "query_too_long")

    def too_long(index: int, exc: InputTooLong) -> ApiError:
        return ApiError(400, f"passage {index} and the query make {exc.tokens} tokens; this model takes at most "
                             f"{exc.limit} a pair; shorten it or {hint}", "input_too_long")

    return await encoded(request, runtime.batcher, pairs, [len(q) + len(p) for q, p in pairs],
                         lambda chunk: runtime.tokenizer.encode(chunk, truncate), too_long)


def relevance(runtime: RerankRuntime, logits: np.ndarray) -> np.ndarray:
    """The score the model was trained to give (sentence-transformers' CrossEncoder.predict): its activation."""
    if runtime.engine.config.reranker.activation == "sigmoid":
        return np.asarray(1.0 / (1.0 + np.exp(-logits.astype(np.float64))))
    return logits.astype(np.float64)


def best_first(scores: np.ndarray) -> list[int]:
    """Indices by descending score; ties keep the passages' order."""
    return sorted(range(len(scores)), key=lambda i: -float(scores[i]))


@router.post("/v1/ranking", tags=["inference"], response_model=RankingResponse,
             openapi_extra=openapi_body(RankingRequest))
async def ranking(request: Request) -> RankingResponse:
    """NIM's reranking API: the passages by the model's logit, best first."""
    state = served(request)
    body = await parse_body(request, RankingRequest)
    runtime = rerank_runtime(state, body.model)
    pairs = [(body.query.text, p.text) for p in body.passages]
    logits, _ = await score_pairs(request, runtime, pairs, body.truncate, 'send "truncate": "END"')
    return RankingResponse(rankings=[Ranking(index=i, logit=float(logits[i])) for i in best_first(logits)])


@router.post("/v1/rerank", tags=["inference"], response_model=RerankResponse, response_model_exclude_none=True,
             openapi_extra=openapi_body(RerankRequest))
@router.post("/rerank", tags=["inference"], response_model=RerankResponse, response_model_exclude_none=True,
             openapi_extra=openapi_body(RerankRequest))
@router.post("/v2/rerank", tags=["inference"], response_model=RerankResponse, response_model_exclude_none=True,
             openapi_extra=openapi_body(RerankRequest))  # Cohere's v2 client's path (vLLM serves it too)
async def rerank(request: Request) -> RerankResponse:
    """The Cohere/Jina shape: the best top_n documents by relevance score, with their text if asked."""
    state = served(request)
    body = await parse_body(request, RerankRequest)
    runtime = rerank_runtime(state, body.model)
    texts = body.texts()
    logits, tokens = await score_pairs(request, runtime, [(body.query, t) for t in texts], body.truncate,
                                       'leave "truncate" out (END)')
    scores = relevance(runtime, logits)
    order = best_first(scores)[: body.top_n]
    results = [RerankResult(index=i, relevance_score=float(scores[i]),
                            document=Document(text=texts[i]) if body.return_documents else None) for i in order]
    return RerankResponse(id=f"rerank-{hex_id()}", model=state.served_names()[0], results=results,
                          usage=Usage(prompt_tokens=tokens, total_tokens=tokens))


@router.post("/v1/score", tags=["inference"], response_model=ScoreResponse, openapi_extra=openapi_body(ScoreRequest))
async def score(request: Request) -> ScoreResponse:
    """vLLM's score API: a relevance score per pair, in the pairs' order."""
    state = served(request)
    body = await parse_body(request, ScoreRequest)
    runtime = rerank_runtime(state, body.model)
    logits, tokens = await score_pairs(request, runtime, body.pairs(), body.truncate, 'send "truncate": "END"')
    scores = relevance(runtime, logits)
    return ScoreResponse(id=f"score-{hex_id()}", created=int(time.time()), model=state.served_names()[0],
                         data=[ScoreData(index=i, score=float(s)) for i, s in enumerate(scores)],
                         usage=Usage(prompt_tokens=tokens, total_tokens=tokens))
