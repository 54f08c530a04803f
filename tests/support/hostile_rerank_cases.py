"""The hostile-input corpus for rerankers (tests/support/hostile_cases.py's rules): NIM's /v1/ranking, the
Cohere/Jina /v1/rerank, /rerank and /v2/rerank, vLLM's /v1/score and KServe V2's query and passages. Each is a 4xx
with a JSON error; the good cases among them are answered whole."""

from __future__ import annotations

from tests.support.corpus import Case, j
from tests.support.hostile_cases import BIG, DEEP, DIGITS, SURROGATE, V2, metadata_cases, raw, text, v2

RANK, RERANK, SCORE = "/v1/ranking", "/v1/rerank", "/v1/score"
PASSAGES = [{"text": "the quick brown dog"}, {"text": "vector python docker"}]
LONG = "docker python vector " * 2000  # far past any pair's tokens
# issue 57: the largest legal rerank (MAX_QUERY_CHARS, MAX_INPUTS): the query is tokenized once, not once a pair
MAXIMAL = j(query=("the quick brown fox jumps " * 400)[:8192],
            documents=[f"document {i} lazy dog vector python docker" for i in range(2048)], truncate="END")
Q = [text("query", ["fox"])]
P = [text("passages", ["the quick brown dog", "vector python docker"])]

RERANK_CASES = [
    Case("rank: 10k passages", RANK, j(query={"text": "fox"}, passages=[{"text": "a"}] * 10_000), 400,
         names="passages"),
    Case("rank: no passages", RANK, j(query={"text": "fox"}, passages=[]), 400, names="passages"),
    Case("rank: empty query", RANK, j(query={"text": ""}, passages=PASSAGES), 400),
    Case("rank: a query of spaces", RANK, j(query={"text": "   "}, passages=PASSAGES), 400),
    Case("rank: a 100k-character query", RANK, j(query={"text": "q" * 100_000}, passages=PASSAGES), 400),
    Case("rank: query a string", RANK, j(query="fox", passages=PASSAGES), 400, names="query"),
    Case("rank: a pair longer than the context", RANK, j(query={"text": "fox"}, passages=[{"text": LONG}]), 400),
    Case("rank: a pair longer than the context, truncate END", RANK,
         j(query={"text": "fox"}, passages=[{"text": LONG}], truncate="END"), 200),
    Case("rank: truncate START", RANK, j(query={"text": "fox"}, passages=PASSAGES, truncate="START"), 400,
         names="truncate"),
    Case("rank: lone surrogate in the query", RANK, j(query={"text": SURROGATE}, passages=PASSAGES), 400),
    Case("rank: lone surrogate in a passage", RANK, j(query={"text": "fox"}, passages=[{"text": SURROGATE}]), 400),
    Case("rank: 100k nested lists as passages", RANK, raw(query={"text": "fox"}, passages=DEEP), 400),
    Case("rerank: 10k documents", RERANK, j(query="fox", documents=["a"] * 10_000), 400, names="documents"),
    Case("rerank: empty query", RERANK, j(query="", documents=["a"]), 400),
    Case("rerank: top_n 10**30", RERANK, j(query="fox", documents=["a"], top_n=BIG), 400, names="top_n"),
    Case("rerank: top_n 0", RERANK, j(query="fox", documents=["a"], top_n=0), 400, names="top_n"),
    Case("rerank: a 5000-digit top_n", RERANK, raw(query="fox", documents=["a"], top_n=DIGITS), 400),
    Case("rerank: top_n past the documents (all of them)", RERANK, j(query="fox", documents=["a", "b"], top_n=50),
         200),
    Case("rerank: documents a string", RERANK, j(query="fox", documents="a b c"), 400, names="documents"),
    Case("rerank: a null document", RERANK, j(query="fox", documents=["a", None]), 400, names="documents"),
    Case("rerank: return_documents 'yes'", RERANK, j(query="fox", documents=["a"], return_documents="yes"), 400,
         names="return_documents"),
    Case("rerank: max_chunks_per_doc (not implemented)", RERANK, j(query="fox", documents=["a"],
                                                                   max_chunks_per_doc=3), 400,
         names="max_chunks_per_doc"),
    Case("rerank: a pair longer than the context (cut, as Cohere cuts)", RERANK, j(query="fox", documents=[LONG]),
         200),
    Case("rerank: the same, truncate NONE", RERANK, j(query="fox", documents=[LONG], truncate="NONE"), 400),
    Case("rerank: an 8,192-character query against 2,048 documents, truncate END", RERANK, MAXIMAL, 200),
    Case("/rerank: lone surrogate in a document", "/rerank", j(query="fox", documents=[SURROGATE]), 400),
    Case("/v2/rerank: max_tokens_per_doc (not implemented)", "/v2/rerank",
         j(query="fox", documents=["a"], max_tokens_per_doc=4), 400, names="max_tokens_per_doc"),
    Case("score: 3 text_1 for 2 text_2", SCORE, j(text_1=["a", "b", "c"], text_2=["x", "y"]), 400, names="text_1"),
    Case("score: 10k text_2", SCORE, j(text_1="fox", text_2=["a"] * 10_000), 400),
    Case("score: text_1 an object", SCORE, j(text_1={"text": "fox"}, text_2="a"), 400, names="text_1"),
    Case("score: empty text_1 list", SCORE, j(text_1=[], text_2=["a"]), 400),
    Case("v2 rerank: 10k passages", V2, v2([*Q, text("passages", ["a"] * 10_000)]), 400),
    Case("v2 rerank: two queries", V2, v2([text("query", ["a", "b"]), *P]), 400),
    Case("v2 rerank: no passages", V2, v2(Q), 400),
    Case("v2 rerank: lone surrogate in a passage", V2, v2([*Q, text("passages", [SURROGATE])]), 400),
    Case("v2 rerank: truncate 5", V2, v2([*Q, *P], parameters={"truncate": 5}), 400),
    Case("v2 rerank: shape [2**40, 2**40]", V2, v2([*Q, text("passages", [], [2**40, 2**40])]), 400),
    Case("v2 rerank: an unknown output", V2, v2([*Q, *P], outputs=[{"name": "embedding"}]), 400),
    *metadata_cases("reranker"),
]
