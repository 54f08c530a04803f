"""The family test matrix: one tiny transformers config per decoder family mbuild builds, from transformers' own
config classes (builder/model/families/ must list exactly these; docs/models.md is generated from them).

Each differs from Llama the way its family does at full size: sliding and global layers with their own rope
bases, q/k norms, soft-capping, fused projections, multipliers, layers without rope, experts. Windows are 8
tokens so the matrix's longer prompts cross them. initializer_range 0.3 keeps random logits far from ties;
Gemma's heads are untied here because a scaled, tied random table makes every greedy token the last input one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import transformers as tf

WINDOW = 8
COMMON: dict[str, Any] = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
                          "initializer_range": 0.3, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
ALTERNATING: dict[str, Any] = {"num_hidden_layers": 3, "sliding_window": WINDOW,
                               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
MOE: dict[str, Any] = {"num_experts_per_tok": 2, "num_hidden_layers": 2}


def family_configs() -> dict[str, Any]:
    """model_type -> a config of that family (fresh objects: tests may change them)."""
    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    gemma3_rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                   "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}
    # Phi-4-mini's shape of rope: LongRoPE over part of each head (here 16 of 32 dimensions)
    phi4_mini_rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                      "original_max_position_embeddings": 64, "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0],
                      "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]}
    configs = [
        tf.LlamaConfig(**COMMON, rope_parameters=llama3_rope),
        tf.MistralConfig(**COMMON, sliding_window=WINDOW),
        tf.Qwen2Config(**COMMON, tie_word_embeddings=True),
        tf.Qwen3Config(**COMMON, head_dim=32),  # head_dim != hidden / heads, as Qwen3's sizes have
        tf.Gemma2Config(**{**COMMON, **ALTERNATING}, head_dim=16, tie_word_embeddings=False,
                        query_pre_attn_scalar=16, attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
        tf.Gemma3TextConfig(**{**COMMON, **ALTERNATING}, head_dim=16, tie_word_embeddings=False,
                            query_pre_attn_scalar=16, rope_parameters=gemma3_rope),
        tf.Phi3Config(**{**COMMON, "hidden_size": 128}, rope_parameters=phi4_mini_rope),
        tf.GraniteConfig(**COMMON, embedding_multiplier=12.0, attention_multiplier=0.05, residual_multiplier=0.22,
                         logits_scaling=8.0),
        tf.Olmo2Config(**COMMON),
        tf.SmolLM3Config(**{**COMMON, "num_hidden_layers": 4}, no_rope_layer_interval=4),
        tf.MixtralConfig(**{**COMMON, **MOE}, num_local_experts=4),
        tf.Qwen3MoeConfig(**{**COMMON, **MOE, "num_hidden_layers": 3, "head_dim": 16}, num_experts=4,
                          moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),  # layer 1 dense
        tf.GptOssConfig(**{**COMMON, **MOE, "num_hidden_layers": 2}, num_local_experts=4, head_dim=16,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                         "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 32,
                                         "truncate": False}),
    ]
    return {config.model_type: config for config in configs}


def generated(folder: Path, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' greedy generate of `new` tokens after each prompt, end tokens not stopping it (the engines
    under test return raw logits, which may pick one)."""
    import torch

    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        made = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                              pad_token_id=0)
        out.append(made[0, len(prompt):].tolist())
    return out


def decoded(engine: Any, first: list[int], new: int) -> list[list[int]]:
    """Greedy decode on a DecoderEngine whose slots 0.. hold prefilled rows, all rows stepping in one batch,
    starting from each row's first token: `new` tokens a row, the first included."""
    tokens, out = list(first), [[t] for t in first]
    for _ in range(new - 1):
        tokens = [int(t) for t in engine.run(0, np.array(tokens).reshape(-1, 1)).argmax(-1)]
        for row, token in zip(out, tokens, strict=True):
            row.append(token)
    return out
