"""The numerical gate for embedding models: the compiled engine against sentence-transformers.

The engine under test is the runtime's own (tokenizer + ONNX Runtime session), so the gate checks
exactly the code the image will serve.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypeVar

import numpy as np
from sentence_transformers import SentenceTransformer

from builder.engine.quiet import quiet_ml
from builder.errors import ValidationFailed
from builder.planning.profiles import Tolerance
from runtimes.bundle import load_engine_config
from runtimes.bundle.codec import write_contract
from runtimes.bundle.report import EncoderReport, GateTolerance, InputCheck, RerankReport
from runtimes.engines import encoder_for
from runtimes.tokenize import TextTokenizer

R = TypeVar("R", EncoderReport, RerankReport)
# Varied on purpose: one word, punctuation, digits, non-ASCII, code, and one far over any limit.
GATE_TEXTS = (
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "A container image is a read-only template with instructions for creating a container.",
    "Prix: 12,50 € — déjà vu, naïve café, Straße, 東京, 😀",
    "def add(a: int, b: int) -> int:\n    return a + b",
    "What is the capital of France? Paris is the capital and most populous city of France.",
    "3.14159 2.71828 1.41421 1e-9 0xFF -42",
    "Kubernetes probes: liveness, readiness and startup decide when traffic reaches a pod. " * 3,
    "   leading and trailing spaces   ",
    "Embeddings map text into vectors so that similar meanings end up close together. " * 40,
)


def run_gate(model_dir: Path, engine_dir: Path, tolerance: Tolerance, report_path: Path) -> EncoderReport:
    """Compare engine and reference on GATE_TEXTS; write report.json; raise if out of tolerance."""
    min_cosine = tolerance.min_cosine
    started = time.perf_counter()  # the load as the image does it: deploy sizes its startup probe from this
    config = load_engine_config(engine_dir)
    engine = encoder_for(engine_dir, config, 0)
    tokenizer = TextTokenizer(engine_dir / config.tokenizer_file, config.max_seq_length)
    load_seconds = time.perf_counter() - started
    options = config.encoder
    # Each gate text as it is, and with each of the model's non-empty prompts before it (as sentence-transformers'
    # encode(prompt_name=...) puts it): None stands for the default prompt, which both sides apply.
    names = [None, *sorted(name for name, prompt in options.prompts.items() if prompt)]
    texts = [options.prompt(name) + text for name in names for text in GATE_TEXTS]
    seqs = tokenizer.encode(texts, truncate="END")  # the reference truncates too
    got = engine.run(seqs)
    with quiet_ml():
        reference = SentenceTransformer(str(model_dir), device="cpu")
        reference.max_seq_length = config.max_seq_length
        want = np.concatenate([reference.encode(list(GATE_TEXTS), prompt_name=name, convert_to_numpy=True,
                                                batch_size=len(GATE_TEXTS), show_progress_bar=False)
                               for name in names])
    want = np.asarray(want, dtype=np.float64)
    got64 = got.astype(np.float64)
    cosine = (got64 * want).sum(1) / (np.linalg.norm(got64, axis=1) * np.linalg.norm(want, axis=1))
    report = EncoderReport(
        reference="sentence-transformers (PyTorch, fp32, CPU)",
        inputs=tuple(InputCheck(t if len(t) <= 80 else t[:77] + "...", len(s), float(c))
                     for t, s, c in zip(texts, seqs, cosine, strict=True)),
        min_cosine=float(cosine.min()),
        mean_cosine=float(cosine.mean()),
        max_abs_diff=float(np.abs(got64 - want).max()),
        tolerance=GateTolerance(**tolerance.model_dump()),
        load_seconds=round(load_seconds, 3),
        summary=f"min cosine {cosine.min():.7f} over {len(texts)} inputs (tolerance {min_cosine})",
        passed=bool(cosine.min() >= min_cosine),
    )
    worst = int(cosine.argmin())
    return settle(report, report_path, f"min cosine {cosine.min():.6f} < {min_cosine} (worst input #{worst}: "
                                       f"{texts[worst][:60]!r})")


def settle(report: R, report_path: Path, why: str) -> R:
    """Write the gate's report; the report, if it passed, else ValidationFailed that says why and where."""
    write_contract(report_path, report)
    if not report.passed:
        raise ValidationFailed(f"the compiled engine differs from the reference: {why}",
                               hint=f"see {report_path}; try a higher precision profile (--precision fp32)")
    return report
