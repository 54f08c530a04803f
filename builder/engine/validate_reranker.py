"""The numerical gate for rerankers: the compiled engine's logit against sentence-transformers' CrossEncoder (a
decoder reranker's: against its model card's recipe in transformers).

The engine under test is the runtime's own (pair tokenizer + ONNX Runtime session), so the gate checks exactly
what the image will serve. A pair passes when its logit is within the profile's max_score_error of the
reference's; the report also counts the queries whose passages come out in the reference's order.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import CrossEncoder

from builder.engine.export_llm_reranker import answer_ids
from builder.engine.quiet import quiet_ml
from builder.engine.validate_encoder import GATE_TEXTS, settle
from builder.errors import UnsupportedModel
from builder.planning.profiles import Tolerance
from runtimes.bundle import load_engine_config
from runtimes.bundle.engine import RerankPrompt
from runtimes.bundle.report import GateTolerance, PairCheck, RerankReport
from runtimes.engines import encoder_for
from runtimes.tokenize import PairTokenizer

# Each query against every gate text: a short and a long query, non-ASCII, and passages past any pair limit
# (GATE_TEXTS' last), so the pair template, the token types and longest-first truncation are all exercised.
GATE_QUERIES = (
    "What is a container image?",
    "Wie hoch ist der Preis für einen Kaffee in Paris? 東京 も",
    "how do kubernetes probes decide when a pod gets traffic " * 6,
)


def _cut(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def rank_correlation(got: np.ndarray, want: np.ndarray, tie: float) -> float:
    """Spearman's rank correlation of the engine's scores against the reference's, where passages whose reference
    scores lie within `tie` of each other (chained) are one tied group: their order is inside the numbers' own noise,
    so a swap there is no disagreement (two scores 1e-7 apart swapped on another CPU read as 0.988). Each group
    takes its average rank on both sides. 1.0 where the reference orders nothing beyond `tie`."""
    if len(got) < 2:
        return 1.0
    order = np.argsort(want, kind="stable")
    group = np.zeros(len(want), dtype=np.int64)
    group[order[1:]] = np.cumsum(np.diff(want[order]) > tie)  # a new group where the gap passes `tie`
    if group.max() == 0:
        return 1.0
    ranks_got = np.argsort(np.argsort(got, kind="stable"), kind="stable").astype(np.float64)
    ranks_want = np.argsort(np.argsort(want, kind="stable"), kind="stable").astype(np.float64)
    for members in (np.flatnonzero(group == g) for g in range(group.max() + 1)):
        ranks_got[members], ranks_want[members] = ranks_got[members].mean(), ranks_want[members].mean()
    if np.ptp(ranks_got) == 0:
        return 0.0
    return float(np.corrcoef(ranks_got, ranks_want)[0, 1])


def cross_encoder_logits(model_dir: Path, max_length: int, pairs: list[tuple[str, str]]) -> np.ndarray:
    """sentence-transformers' CrossEncoder's logits for the pairs (no activation)."""
    with quiet_ml():
        reference = CrossEncoder(str(model_dir), device="cpu", max_length=max_length)
        try:
            return np.asarray(reference.predict(pairs, activation_fn=torch.nn.Identity(), batch_size=len(pairs),
                                                show_progress_bar=False, convert_to_numpy=True), dtype=np.float64)
        except (IndexError, RuntimeError, ValueError) as exc:  # the model's own code, on its own tokenizer's pairs
            raise UnsupportedModel(
                f"the model cannot score a (query, passage) pair with its own tokenizer in transformers: {exc}",
                hint="its tokenizer and config disagree (token types, vocabulary or positions); fix the "
                     "checkpoint, or check that sentence-transformers' CrossEncoder loads it") from exc


def card_logits(model_dir: Path, prompt: RerankPrompt, max_length: int, pairs: list[tuple[str, str]]) -> np.ndarray:
    """A decoder reranker's logits as its model card computes them (Qwen3-Reranker's): transformers' tokenizer on
    the formatted pair cut to the room the prefix and suffix leave, the causal LM's logits at the last position,
    "yes" minus "no". One pair at a time, so no padding enters the reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_ml():
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        yes, no = answer_ids(tokenizer)
        prefix = tokenizer.encode(prompt.prefix, add_special_tokens=False)
        suffix = tokenizer.encode(prompt.suffix, add_special_tokens=False)
        room = max_length - len(prefix) - len(suffix)
        out = []
        with torch.no_grad():
            for query, passage in pairs:
                body = tokenizer(prompt.text(query, passage), truncation=True, max_length=room).input_ids
                logits = model(torch.tensor([prefix + body + suffix])).logits[0, -1]
                out.append(float(logits[yes] - logits[no]))
    return np.asarray(out, dtype=np.float64)


def run_gate(model_dir: Path, engine_dir: Path, tolerance: Tolerance, report_path: Path) -> RerankReport:
    """Compare engine and reference on every (query, gate text) pair; write report.json; raise if out of
    tolerance."""
    started = time.perf_counter()  # the load as the image does it: deploy sizes its startup probe from this
    config = load_engine_config(engine_dir)
    engine = encoder_for(engine_dir, config, 0)
    tokenizer = PairTokenizer.of_engine(engine_dir, config)
    load_seconds = time.perf_counter() - started
    pairs = [(query, text) for query in GATE_QUERIES for text in GATE_TEXTS]
    seqs = tokenizer.encode(pairs, truncate="END")  # the reference truncates too
    got = engine.score(seqs).astype(np.float64)
    prompt = config.reranker.prompt
    want = (cross_encoder_logits(model_dir, config.max_seq_length, pairs) if prompt is None
            else card_logits(model_dir, prompt, config.max_seq_length, pairs))
    error = np.abs(got - want)
    per_query = len(GATE_TEXTS)
    tie = 2 * float(error.max())  # passages nearer than that may swap within the engine's measured error
    spearman = min(rank_correlation(got[i:i + per_query], want[i:i + per_query], tie)
                   for i in range(0, len(pairs), per_query))
    limit = tolerance.max_score_error
    passed = bool(error.max() <= limit)
    report = RerankReport(
        reference=("sentence-transformers CrossEncoder (PyTorch, fp32, CPU), logits" if prompt is None else
                   "the model card's recipe in transformers (PyTorch, fp32, CPU): yes minus no logits"),
        pairs=tuple(PairCheck(_cut(q), _cut(p), len(s), float(g), float(w))
                    for (q, p), s, g, w in zip(pairs, seqs, got, want, strict=True)),
        max_score_error=float(error.max()), mean_score_error=float(error.mean()), min_rank_correlation=spearman,
        tolerance=GateTolerance(**tolerance.model_dump()),
        load_seconds=round(load_seconds, 3),
        summary=(f"max logit error {error.max():.6f} over {len(pairs)} pairs (tolerance {limit}); "
                 f"passages' order against the reference's: Spearman {spearman:.4f} at worst"),
        passed=passed,
    )
    worst = int(error.argmax())
    return settle(report, report_path, f"max logit error {error.max():.6f} > {limit} (worst pair #{worst}: "
                                       f"{pairs[worst][0][:40]!r} / {pairs[worst][1][:40]!r})")
