"""A Llama whose greedy continuation is known in advance, built analytically (no training), for the speculative
decoding benchmark (bench/scenarios/speculative.py).

Random weights, as transformers initializes a Llama, except: every layer's o_proj and down_proj are zero, so neither
attention nor the MLP adds anything to the residual stream, which at a position stays its token's embedding e_t; and
the untied LM head's row f(t) is e_t * SCALE, for a fixed permutation f of the vocabulary. After the final RMS norm
the position holds n = e_t / rms(e_t), whose entries are ~N(0, 1): the logit of f(t) is SCALE * |e_t|^2 / rms(e_t)
= SCALE * hidden * rms(e_t), every other logit is SCALE * e_u . n ~ N(0, hidden * (SCALE * sigma)^2), so the right
one leads by ~sqrt(hidden) standard deviations (27 at hidden 640, 11 at 128) and the greedy next token after t is
f(t) whatever came before. Attention and the MLP still run at full cost, so a decode step costs what a real model of
the shape costs.

A draft model for it (make_agreeing_llama with `error`): the same construction, usually smaller, whose successor
function is f except on a random share `error` of the text cycle's tokens, where it skips one (f(f(t))): a draft
after such a token is wrong, so a draft's acceptance is about 1 - error. Its successor is saved beside it
(`successor_path`) for the replay.

f is one long cycle through the tokens that stream text on their own (bench.lib.llm_peer_checks.Texts.silent's
complement, ~31,700 of the Llama SPM vocabulary's 32,000) and another through the rest (special tokens, byte pieces),
which no prompt reaches: a server asked for ignore_eos bans EOS (llama.cpp does), and one holds back byte pieces
until they form a character, either of which would break the chain. The cycle's order is saved beside the model
(`order_path`): order[i + 1] follows order[i].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, LlamaConfig

from bench.lib.llm_models import VOCAB, save_spm_tokenizer, weight_shapes
from bench.lib.llm_peer_checks import Texts

SCALE = 2.0  # a power of two: the LM head's bf16 rows are exactly the bf16 embedding's, scaled
SIGMA = 0.02  # transformers' Llama initializer
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def order_path(folder: Path) -> Path:
    """Where the text-streaming cycle's order is kept: beside the model folder, which stays a plain checkpoint."""
    return folder.with_name(f"{folder.name}-cycle.npy")


def successor_path(folder: Path) -> Path:
    return folder.with_name(f"{folder.name}-successor.npy")


def cycles(vocab: int, silent: set[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(successor, order): f as an array (successor[t] = f(t)), one cycle through the tokens not in `silent` in a
    random order (returned as `order`), another through `silent`."""
    rng = np.random.default_rng(seed)
    successor = np.empty(vocab, np.int64)
    order, rest = (rng.permutation(np.array(sorted(members), np.int64))
                   for members in (set(range(vocab)) - silent, silent))
    for ring in (order, rest):
        successor[ring] = np.roll(ring, -1)
    return successor, order


def with_errors(successor: np.ndarray, order: np.ndarray, error: float, seed: int) -> np.ndarray:
    """A draft's successor function: f, except that after a random share `error` of the text cycle's tokens it
    skips one (f(f(t))), so a draft there is wrong."""
    drafted = successor.copy()
    wrong = order[np.random.default_rng(seed).random(order.size) < error]
    drafted[wrong] = successor[successor[wrong]]
    return drafted


def agreeing_weights(config: LlamaConfig, successor: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
    shapes = weight_shapes(config)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name == "lm_head.weight":
            continue
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith(ZEROED):
            tensors[name] = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = torch.normal(0.0, SIGMA, tuple(shape), generator=generator).to(torch.bfloat16)
    # Row u is the sum of e_t over the tokens t that u follows: e_t alone where f is a permutation (the target), two
    # embeddings where a draft's f sends two tokens to u (with_errors), whose logits each still lead by ~|e_t|^2.
    embed = tensors["model.embed_tokens.weight"].float()
    head = torch.zeros_like(embed).index_add_(0, torch.from_numpy(successor), embed)
    tensors["lm_head.weight"] = (head * SCALE).to(torch.bfloat16)
    return tensors


def make_agreeing_llama(folder: Path, shape: dict[str, Any], gguf_vocab: Path, seed: int = 0,
                        error: float = 0.0) -> Path:
    """The model of `shape` (an untied Llama shape) with the Llama SPM tokenizer, bf16 safetensors in `folder`, its
    cycle's order in order_path(folder), its successor function in successor_path(folder); made once (config.json,
    written last, marks a finished folder). error > 0: a draft for seed's model, wrong after that share of tokens."""
    if (folder / "config.json").is_file() and order_path(folder).is_file():
        return folder
    if shape.get("tie_word_embeddings", True):
        raise ValueError("the analytic model needs an untied LM head (tie_word_embeddings false)")
    folder.mkdir(parents=True, exist_ok=True)
    save_spm_tokenizer(folder, gguf_vocab)
    silent = {int(token) for token in Texts(folder).silent(limit=VOCAB)}
    successor, order = cycles(VOCAB, silent, seed)
    if error:
        successor = with_errors(successor, order, error, seed + 1)
    config = LlamaConfig(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, architectures=["LlamaForCausalLM"],
                         dtype="bfloat16", **shape)
    save_file(agreeing_weights(config, successor, seed), folder / "model.safetensors", metadata={"format": "pt"})
    GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=False).save_pretrained(folder)
    np.save(order_path(folder), order)
    np.save(successor_path(folder), successor)
    config.save_pretrained(folder)
    return folder


def load_order(folder: Path) -> np.ndarray:
    return np.asarray(np.load(order_path(folder)), np.int64)


def load_successor(folder: Path) -> np.ndarray:
    return np.asarray(np.load(successor_path(folder)), np.int64)


def margin(folder: Path, samples: int = 512, seed: int = 1) -> dict[str, float]:
    """The LM head's lead for f(t) after t alone (the residual stream is e_t), on `samples` tokens of the cycle, from
    the stored bf16 weights: the smallest lead of the right logit over the best other, in the other logits' standard
    deviations, and the share of sampled tokens whose argmax is f(t)."""
    weights = load_file(folder / "model.safetensors")
    embed, head = weights["model.embed_tokens.weight"].float(), weights["lm_head.weight"].float()
    order = load_order(folder)
    picked = np.random.default_rng(seed).choice(order.size, size=min(samples, order.size), replace=False)
    tokens, following = torch.from_numpy(order[picked]), torch.from_numpy(order[(picked + 1) % order.size])
    rows = embed[tokens]
    normed = rows / rows.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    logits = normed @ head.T  # [samples, vocab]
    right = logits.gather(1, following[:, None]).squeeze(1)
    others = logits.scatter(1, following[:, None], float("-inf"))
    spread = logits.scatter(1, following[:, None], 0.0).std(dim=1)
    lead = (right - others.max(dim=1).values) / spread
    return {"tokens": float(len(picked)), "right_logit_mean": float(right.mean()),
            "other_logit_std": float(spread.mean()), "min_lead_sd": float(lead.min()),
            "argmax_right": float((logits.argmax(dim=1) == following).float().mean())}


def greedy_follows(folder: Path, prompt: list[int], expected: list[int]) -> int:
    """How many of `expected` transformers' own greedy decode of `prompt` gives in order (the whole model, attention
    and MLP included, in fp32): the check that the analytic argument holds for the real forward pass."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(expected), do_sample=False,
                             min_new_tokens=len(expected), pad_token_id=0)
    got = out[0, len(prompt):].tolist()
    return next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), len(expected))
