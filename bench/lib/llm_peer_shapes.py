"""The model shapes of the peer comparisons (bench/scenarios/llm_peer.py against llama.cpp, llm_vllm.py against vLLM),
how much each runs, and the random checkpoint each is served from (the real Llama SPM tokenizer, 32000 tokens)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.lib import llamacpp
from bench.lib.llm_models import LLAMA_1B, LLAMA_100M, LLAMA_TINY, make_spm_decoder

# Llama-3.2-1B's layers, 4 of them, untied: every matmul at least 2048 wide, few nodes; on a small vocabulary (8000
# words in step_breakdown, the SPM's 32000 here) the step is nearly all layer matmuls
WIDE = {**LLAMA_1B, "num_hidden_layers": 4, "tie_word_embeddings": False}
# issue 61's held-out mixture of experts: Qwen3-MoE layers, 16 experts of 512, top-4, hidden 1024, 8 layers
MOE = {"hidden_size": 1024, "intermediate_size": 3072, "moe_intermediate_size": 512, "num_experts": 16,
       "num_experts_per_tok": 4, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
       "max_position_embeddings": 2048, "tie_word_embeddings": False}


@dataclass(frozen=True)
class Shape:
    key: str
    title: str
    config: dict[str, Any]
    concurrency: tuple[int, ...] = (1, 4, 16)
    sequential: int = 4  # requests at concurrency 1
    warm: int = 16  # the concurrency of the warm-up wave each arm gets before the rounds
    new_tokens: int = 64
    max_repeats: int = 99
    greedy_prompts: int = 8
    greedy_tokens: int = 16
    prefix_tokens: int = 1000
    prefix_samples: int = 3
    run_seconds: float = 300.0
    # the pair's servers up one at a time, each arm's rounds in turn: where both together would not fit in the host's
    # RAM, a pair measures paging, not engines (seen: a dense 1.7B's fp32 KV for 16 x 2048 beside llama.cpp's weights)
    apart: bool = False
    model_type: str = "llama"  # transformers' model_type of the checkpoint: llama or qwen3_moe

    @property
    def folder(self) -> str:
        """The checkpoint's folder in a work folder (llama-100m-spm, qwen3_moe-moe-spm)."""
        return f"{self.model_type}-{self.key}-spm"


SHAPES = (Shape("100m", "random ~100M Llama", LLAMA_100M),
          # fp32 reads ~4 GB of weights a decode step on one core (~0.25 s): one request at c=1, a c=4 warm-up,
          # one round, one shared-prefix sample
          Shape("1b", "random Llama-3.2-1B-shaped", LLAMA_1B, sequential=1, warm=4, max_repeats=1,
                prefix_samples=1, run_seconds=1200.0),
          Shape("moe", "random Qwen3-MoE: 8 layers of 16 experts of 512, top-4, hidden 1024", MOE,
                model_type="qwen3_moe"),
          Shape("wide", "random wide and shallow: Llama-3.2-1B's layers, 4 of them, untied", WIDE))
KEYS = tuple(shape.key for shape in SHAPES)


def make_model(shape: Shape, work: Path) -> Path:
    """The shape's random fp32 checkpoint on the real Llama SPM tokenizer, made once in `work` (seeded: every
    scenario that shares the work folder serves the same weights)."""
    return make_spm_decoder(work / shape.folder, shape.model_type, shape.config, llamacpp.SPM_VOCAB)


def chosen(keys: list[str]) -> list[Shape]:
    """The shapes of `keys`, in SHAPES' order; an unknown key is an error naming the known ones."""
    if unknown := sorted(set(keys) - set(KEYS)):
        raise ValueError(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(KEYS)}")
    return [shape for shape in SHAPES if shape.key in keys]


def quick(shape: Shape) -> Shape:
    """A smoke-sized version: two concurrencies, short outputs, few prompts."""
    return replace(shape, concurrency=(1, 4), sequential=2, warm=4, new_tokens=16, greedy_prompts=2, greedy_tokens=8,
                   prefix_tokens=256, prefix_samples=1, max_repeats=1)


def smoke(shape: Shape) -> Shape:
    """The real shape cut to a check that every arm serves it: c=1 only, one request of 8 tokens, one round."""
    return replace(shape, concurrency=(1,), sequential=1, warm=1, new_tokens=8, greedy_prompts=1, greedy_tokens=4,
                   prefix_tokens=128, prefix_samples=1, max_repeats=1)


QUICK = quick(Shape("tiny", "random tiny Llama (quick)", LLAMA_TINY))
