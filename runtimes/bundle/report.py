"""report.json: the numerical gate's verdict and measurements, one type per task.

Written by the builder's gates (validate_encoder, validate_reranker, validate_decoder) and the engine cache; read by
the runtime's /v1/metadata and by the builder's labels, serve, inspect and deploy (its load time sizes the startup
probe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from runtimes.bundle.codec import ContractError, bounds, check_format, decode, encode

REPORT_FILE = "report.json"
REPORT_FORMAT = 1


@dataclass(frozen=True)
class GateTolerance:
    """The profile's tolerance the gate judged by."""

    min_cosine: float
    greedy_exact: bool
    min_top1: float
    max_logit_error: float | None
    max_score_error: float | None = None  # rerankers: the largest logit difference allowed


@dataclass(frozen=True)
class InputCheck:
    text: str  # cut to 80 characters
    tokens: int
    cosine: float


@dataclass(frozen=True)
class PairCheck:
    query: str  # each cut to 80 characters
    passage: str
    tokens: int
    engine: float  # the engine's logit
    reference: float  # the reference's


@dataclass(frozen=True)
class PromptCheck:
    text: str
    prompt_tokens: int
    engine: tuple[int, ...]  # the engine's greedy tokens
    reference: tuple[int, ...]  # what the reference picks after each of them
    equal: bool


@dataclass(frozen=True, kw_only=True)
class _Gate:
    format: int = REPORT_FORMAT
    reference: str  # what the engine was compared with
    tolerance: GateTolerance
    load_seconds: float = field(metadata=bounds(0, 86_400))  # the engine's load as the image does it
    summary: str
    passed: bool

    @property
    def verdict(self) -> str:
        """One line for people: 'passed: <summary>' or 'FAILED: <summary>'."""
        return verdict(self.passed, self.summary)

    def headline(self) -> dict[str, Any]:
        """What /v1/metadata shows of the gate: the verdict, the tolerance and the task's headline numbers."""
        numbers = {name: getattr(self, name) for name in getattr(self, "HEADLINE", ())}
        return {"passed": self.passed, "summary": self.summary, **numbers, "tolerance": encode(self.tolerance)}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data


@dataclass(frozen=True, kw_only=True)
class EncoderReport(_Gate):
    """Cosine to sentence-transformers' embedding, per gate text."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("min_cosine", "max_abs_diff")
    task: Literal["embedding"] = "embedding"
    inputs: tuple[InputCheck, ...]
    min_cosine: float
    mean_cosine: float
    max_abs_diff: float

    @property
    def label(self) -> str:
        """The image's dev.mbuild.validation label: the verdict and the headline number."""
        return f"passed={self.passed} min_cosine={self.min_cosine:.6f}"


@dataclass(frozen=True, kw_only=True)
class RerankReport(_Gate):
    """The classification head's logit against sentence-transformers' CrossEncoder, per gate pair; and how alike
    each query's order of passages is to the reference's (Spearman's rank correlation; 1 is the same order;
    passages the reference scores within twice the largest measured error of each other count as tied)."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("max_score_error", "min_rank_correlation")
    task: Literal["rerank"] = "rerank"
    pairs: tuple[PairCheck, ...]
    max_score_error: float
    mean_score_error: float
    min_rank_correlation: float  # the lowest over the gate's queries

    @property
    def label(self) -> str:
        return f"passed={self.passed} max_score_error={self.max_score_error:.6f}"


@dataclass(frozen=True)
class CacheCheck:
    """The gate's numbers for the same engine with the other KV cache: the fp32 one beside an int8 cache that
    passed, or the int8 one that failed beside the fp32 cache the engine kept."""

    greedy_equal: int
    top1_agreement: float
    max_logit_error: float


@dataclass(frozen=True, kw_only=True)
class DecoderReport(_Gate):
    """Greedy decode against transformers, then the logits along the engine's tokens (teacher-forced)."""

    HEADLINE: ClassVar[tuple[str, ...]] = ("greedy_equal", "top1_agreement")
    task: Literal["text-generation"] = "text-generation"
    new_tokens: int  # per prompt
    batched: int  # prompts decoded together
    prompts: tuple[PromptCheck, ...]
    greedy_equal: int  # prompts whose greedy decode equals the reference's
    top1_agreement: float
    max_logit_error: float
    mean_logit_error: float
    positions: int
    kv_cache: Literal["fp32", "int8"] = "fp32"  # what the engine keeps its keys and values in
    fp32_cache: CacheCheck | None = None  # an int8 cache's engine: the same gate with the fp32 cache
    int8_cache: CacheCheck | None = None  # an engine whose int8 cache failed the gate (it kept fp32): that gate

    @property
    def label(self) -> str:
        return (f"passed={self.passed} greedy_equal={self.greedy_equal}/{len(self.prompts)} "
                f"top1={self.top1_agreement:.4f}")


GateReport = EncoderReport | RerankReport | DecoderReport
_REPORTS: dict[str, type[EncoderReport] | type[RerankReport] | type[DecoderReport]] = {
    "embedding": EncoderReport, "rerank": RerankReport, "text-generation": DecoderReport}


def verdict(passed: bool, summary: str) -> str:
    return f"{'passed' if passed else 'FAILED'}: {summary}".rstrip(": ")


def read_gate_report(raw: object) -> GateReport:
    """report.json's object as its task's report; ContractError for another format or a bad field."""
    check_format(raw, REPORT_FILE, REPORT_FORMAT)
    task = raw.get("task") if isinstance(raw, dict) else None
    if task not in _REPORTS:
        raise ContractError(f"{REPORT_FILE}: task must be one of {', '.join(map(repr, _REPORTS))} (got {task!r})")
    return decode(_REPORTS[str(task)], raw, REPORT_FILE)
